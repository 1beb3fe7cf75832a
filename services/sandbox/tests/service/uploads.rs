//! UploadFiles: unsafe names, symlinked and hard-linked destinations, over-limit sizes and counts, and the
//! all-or-nothing rule.

use antler_proto::sandbox::*;
use sha2::Digest;
use tonic::Code;

use crate::common::{self, ALICE_KEY, bounded, expect_code, req};

const T: &str = "up";

fn header(files: Vec<(&str, u64)>) -> UploadFilesRequest {
    UploadFilesRequest {
        payload: Some(upload_files_request::Payload::Header(UploadHeader {
            thread_id: T.into(),
            files: files
                .into_iter()
                .map(|(name, size)| UploadFileSpec { filename: name.into(), size_bytes: size, ..Default::default() })
                .collect(),
            convert_documents: false,
        })),
    }
}

fn chunk(index: u32, data: &[u8]) -> UploadFilesRequest {
    UploadFilesRequest { payload: Some(upload_files_request::Payload::Chunk(UploadChunk { file_index: index, data: data.to_vec() })) }
}

async fn upload(c: &mut common::Client, messages: Vec<UploadFilesRequest>) -> Result<UploadFilesResponse, tonic::Status> {
    c.upload_files(req(ALICE_KEY, tokio_stream::iter(messages))).await.map(|r| r.into_inner())
}

fn listing(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()).unwrap_or_default();
    names.sort();
    names
}

#[tokio::test]
async fn unsafe_names_are_reduced_or_skipped_and_collisions_get_suffixes() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("").await?;
        let mut c = server.client().await?;
        common::acquire(&mut c, ALICE_KEY, T).await?;
        let long = "n".repeat(256);
        let names = vec![
            ("../../etc/passwd", 1),
            ("report.pdf", 1),
            ("a/b/Report.PDF", 1),
            ("..", 1),
            ("", 1),
            ("x\\y.txt", 1),
            (long.as_str(), 1),
            ("dir/", 1),
        ];
        let count = names.len();
        let mut messages = vec![header(names)];
        for i in 0..count {
            messages.push(chunk(u32::try_from(i)?, b"x"));
        }
        let out = upload(&mut c, messages).await?;
        let stored: Vec<(&str, &str)> = out.files.iter().map(|f| (f.original_filename.as_str(), f.filename.as_str())).collect();
        assert_eq!(stored, [("../../etc/passwd", "passwd"), ("report.pdf", "report.pdf"), ("a/b/Report.PDF", "Report_1.PDF")]);
        assert_eq!(out.files[0].virtual_path, "/mnt/user-data/uploads/passwd");
        assert_eq!(out.files[0].sha256, hex::encode(sha2::Sha256::digest(b"x")));
        let skipped: Vec<u32> = out.skipped.iter().map(|s| s.index).collect();
        assert_eq!(skipped, [3, 4, 5, 6, 7]);
        assert!(out.skipped.iter().all(|s| s.reason.starts_with("filename is unsafe")), "{:?}", out.skipped);
        assert_eq!(listing(&server.host_root("alice", T, "uploads")), ["Report_1.PDF", "passwd", "report.pdf"]);
        Ok(())
    })
    .await
}

#[tokio::test]
async fn symlinked_and_hard_linked_destinations_are_never_written_through() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("").await?;
        let mut c = server.client().await?;
        common::acquire(&mut c, ALICE_KEY, T).await?;
        let uploads = server.host_root("alice", T, "uploads");
        let outside = server.dir.path().join("outside.txt");
        std::fs::write(&outside, "ORIGINAL")?;
        std::os::unix::fs::symlink(&outside, uploads.join("evil.txt"))?;
        std::os::unix::fs::symlink(server.dir.path().join("not-yet.txt"), uploads.join("dangling.txt"))?;
        std::fs::hard_link(&outside, uploads.join("hl.txt"))?;
        let out = upload(
            &mut c,
            vec![
                header(vec![("evil.txt", 5), ("dangling.txt", 5), ("hl.txt", 5)]),
                chunk(0, b"PWNED"),
                chunk(1, b"PWNED"),
                chunk(2, b"PWNED"),
            ],
        )
        .await?;
        let stored: Vec<&str> = out.files.iter().map(|f| f.filename.as_str()).collect();
        assert_eq!(stored, ["evil_1.txt", "dangling_1.txt", "hl_1.txt"]);
        assert_eq!(std::fs::read_to_string(&outside)?, "ORIGINAL");
        assert!(!server.dir.path().join("not-yet.txt").exists(), "a dangling link was written through");
        for name in stored {
            let meta = std::fs::symlink_metadata(uploads.join(name))?;
            assert!(meta.is_file() && std::os::unix::fs::MetadataExt::nlink(&meta) == 1, "{name}");
        }
        Ok(())
    })
    .await
}

#[tokio::test]
async fn over_limit_uploads_are_refused_before_any_byte_is_written() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("uploads:\n  max_files: 3\n  max_file_bytes: 1000\n  max_total_bytes: 1500").await?;
        let mut c = server.client().await?;
        common::acquire(&mut c, ALICE_KEY, T).await?;
        let uploads = server.host_root("alice", T, "uploads");
        let too_many =
            expect_code(upload(&mut c, vec![header(vec![("a", 1), ("b", 1), ("c", 1), ("d", 1)])]).await, Code::ResourceExhausted, "count");
        assert!(too_many.message().contains("max_files"), "{}", too_many.message());
        let too_big = expect_code(upload(&mut c, vec![header(vec![("a", 1001)])]).await, Code::ResourceExhausted, "size");
        assert!(too_big.message().contains("1000"), "{}", too_big.message());
        expect_code(upload(&mut c, vec![header(vec![("a", 800), ("b", 800)])]).await, Code::ResourceExhausted, "total");
        assert!(listing(&uploads).is_empty(), "{:?}", listing(&uploads));
        Ok(())
    })
    .await
}

#[tokio::test]
async fn failed_uploads_leave_nothing_behind() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("").await?;
        let mut c = server.client().await?;
        common::acquire(&mut c, ALICE_KEY, T).await?;
        let uploads = server.host_root("alice", T, "uploads");
        // More bytes than declared for the second file, after the first was complete.
        let more = upload(&mut c, vec![header(vec![("one.txt", 3), ("two.txt", 2)]), chunk(0, b"abc"), chunk(1, b"abc")]).await;
        assert!(expect_code(more, Code::InvalidArgument, "too many bytes").message().contains("two.txt"));
        // Fewer bytes than declared.
        expect_code(upload(&mut c, vec![header(vec![("one.txt", 3)]), chunk(0, b"ab")]).await, Code::InvalidArgument, "short");
        // A checksum that does not match.
        let mut with_sha = header(vec![("one.txt", 3)]);
        if let Some(upload_files_request::Payload::Header(h)) = &mut with_sha.payload {
            h.files[0].sha256 = "0".repeat(64);
        }
        expect_code(upload(&mut c, vec![with_sha, chunk(0, b"abc")]).await, Code::InvalidArgument, "sha256");
        // Chunks out of order, a missing header, a repeated header.
        expect_code(
            upload(&mut c, vec![header(vec![("a", 1), ("b", 1)]), chunk(1, b"x"), chunk(0, b"x")]).await,
            Code::InvalidArgument,
            "order",
        );
        expect_code(upload(&mut c, vec![chunk(0, b"x")]).await, Code::InvalidArgument, "no header");
        expect_code(upload(&mut c, vec![header(vec![("a", 1)]), header(vec![("a", 1)])]).await, Code::InvalidArgument, "two headers");
        // The client goes away in the middle of a file.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(header(vec![("gone.txt", 100)])).await?;
        tx.send(chunk(0, b"partial")).await?;
        let mut aborting = c.clone();
        let call =
            tokio::spawn(async move { aborting.upload_files(req(ALICE_KEY, tokio_stream::wrappers::ReceiverStream::new(rx))).await });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        call.abort();
        drop(tx);
        for _ in 0..100 {
            if listing(&uploads).is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(listing(&uploads).is_empty(), "left behind: {:?}", listing(&uploads));
        // And a good upload still works afterwards.
        let ok = upload(&mut c, vec![header(vec![("one.txt", 3)]), chunk(0, b"abc")]).await?;
        assert_eq!(ok.files[0].filename, "one.txt");
        Ok(())
    })
    .await
}
