//! The file tools over gRPC: the behaviours and limits the proto documents.

use sha2::Digest;
use tonic::Code;

use antler_proto::sandbox::*;

use crate::common::{self, ALICE_KEY, bounded, expect_code, req};

const T: &str = "files";

#[tokio::test]
async fn read_write_and_the_documented_caps() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("files:\n  read_max_chars: 1000\n  write_max_bytes: 2000").await?;
        let mut c = server.client().await?;
        common::acquire(&mut c, ALICE_KEY, T).await?;
        let body: String = (1..=300).map(|i| format!("line {i}\n")).collect();
        let too_big = expect_code(common::write(&mut c, ALICE_KEY, T, "big.txt", &body).await, Code::ResourceExhausted, "write cap");
        assert!(too_big.message().contains("2000") && too_big.message().contains("append"), "{}", too_big.message());
        let (head, tail) = body.split_at(1500);
        let created = common::write(&mut c, ALICE_KEY, T, "dir/big.txt", head).await?;
        assert!(created.created);
        let appended = c
            .write_file(req(
                ALICE_KEY,
                WriteFileRequest {
                    thread_id: T.into(),
                    path: "/mnt/user-data/workspace/dir/big.txt".into(),
                    content: Some(write_file_request::Content::Text(tail.into())),
                    append: true,
                },
            ))
            .await?
            .into_inner();
        assert_eq!(appended.size_bytes, body.len() as u64);

        let whole = common::read(&mut c, ALICE_KEY, T, "dir/big.txt").await?;
        assert!(whole.truncated);
        assert_eq!((whole.shown_chars, whole.total_chars, whole.total_lines), (1000, body.len() as u64, 300));
        assert!(whole.content.ends_with(&whole.truncation_marker) && whole.truncation_marker.contains("Use start_line/end_line"));
        let range = c
            .read_file(req(
                ALICE_KEY,
                ReadFileRequest { thread_id: T.into(), path: "dir/big.txt".into(), start_line: 10, end_line: 12, max_chars: 0 },
            ))
            .await?
            .into_inner();
        assert_eq!((range.content.as_str(), range.start_line, range.end_line), ("line 10\nline 11\nline 12\n", 10, 12));
        let bad_range = c
            .read_file(req(
                ALICE_KEY,
                ReadFileRequest { thread_id: T.into(), path: "dir/big.txt".into(), start_line: 5, end_line: 2, max_chars: 0 },
            ))
            .await;
        assert!(expect_code(bad_range, Code::InvalidArgument, "range").message().starts_with("end_line"));

        let binary = c
            .write_file(req(
                ALICE_KEY,
                WriteFileRequest {
                    thread_id: T.into(),
                    path: "bin.dat".into(),
                    content: Some(write_file_request::Content::Data(vec![0, 1, 2, 255])),
                    append: false,
                },
            ))
            .await?
            .into_inner();
        assert_eq!(binary.bytes_written, 4);
        let read = common::read(&mut c, ALICE_KEY, T, "bin.dat").await?;
        assert!(read.binary && read.content.is_empty());
        expect_code(common::read(&mut c, ALICE_KEY, T, "dir").await, Code::FailedPrecondition, "read a directory");
        expect_code(common::read(&mut c, ALICE_KEY, T, "missing.txt").await, Code::NotFound, "read missing");
        expect_code(common::write(&mut c, ALICE_KEY, T, "/mnt/skills/x.md", "x").await, Code::PermissionDenied, "skills are read-only");
        Ok(())
    })
    .await
}

#[tokio::test]
async fn edit_list_glob_and_grep() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("").await?;
        let mut c = server.client().await?;
        common::acquire(&mut c, ALICE_KEY, T).await?;
        common::write(&mut c, ALICE_KEY, T, "src/main.rs", "fn main() {\n    println!(\"hi\");\n    println!(\"hi\");\n}\n").await?;
        common::write(&mut c, ALICE_KEY, T, "src/deep/lib.rs", "pub fn Lib() {}\n").await?;
        common::write(&mut c, ALICE_KEY, T, "node_modules/x.js", "println\n").await?;
        common::write(&mut c, ALICE_KEY, T, "notes.md", "hello\n").await?;

        let edit = |old: &str, new: &str, all: bool| EditFileRequest {
            thread_id: T.into(),
            path: "src/main.rs".into(),
            old_str: old.into(),
            new_str: new.into(),
            replace_all: all,
        };
        let twice =
            expect_code(c.edit_file(req(ALICE_KEY, edit("println!(\"hi\")", "x", false))).await, Code::FailedPrecondition, "ambiguous");
        assert!(twice.message().contains("2 times"), "{}", twice.message());
        expect_code(c.edit_file(req(ALICE_KEY, edit("nope", "x", false))).await, Code::FailedPrecondition, "not found");
        expect_code(c.edit_file(req(ALICE_KEY, edit("", "x", false))).await, Code::InvalidArgument, "empty old_str");
        let done = c.edit_file(req(ALICE_KEY, edit("println!(\"hi\")", "log(\"hi\")", true))).await?.into_inner();
        assert_eq!(done.replacements, 2);

        let list = c.list_dir(req(ALICE_KEY, ListDirRequest { thread_id: T.into(), ..Default::default() })).await?.into_inner();
        let paths: Vec<&str> = list.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/mnt/user-data/workspace/notes.md",
                "/mnt/user-data/workspace/src/",
                "/mnt/user-data/workspace/src/deep/",
                "/mnt/user-data/workspace/src/main.rs"
            ]
        );
        expect_code(
            c.list_dir(req(ALICE_KEY, ListDirRequest { thread_id: T.into(), max_depth: 3, ..Default::default() })).await,
            Code::InvalidArgument,
            "depth",
        );

        let glob = c
            .glob(req(ALICE_KEY, GlobRequest { thread_id: T.into(), pattern: "**/*.rs".into(), ..Default::default() }))
            .await?
            .into_inner();
        assert_eq!(glob.paths, ["/mnt/user-data/workspace/src/deep/lib.rs", "/mnt/user-data/workspace/src/main.rs"]);
        let capped = c
            .glob(req(ALICE_KEY, GlobRequest { thread_id: T.into(), pattern: "**/*".into(), max_results: 1, ..Default::default() }))
            .await?
            .into_inner();
        assert!(capped.truncated && capped.paths.len() == 1);

        let grep = c
            .grep(req(
                ALICE_KEY,
                GrepRequest { thread_id: T.into(), pattern: "LIB|LOG".into(), case_insensitive: true, ..Default::default() },
            ))
            .await?
            .into_inner();
        let found: Vec<(&str, u32)> = grep.matches.iter().map(|m| (m.path.as_str(), m.line_number)).collect();
        assert_eq!(
            found,
            [
                ("/mnt/user-data/workspace/src/deep/lib.rs", 1),
                ("/mnt/user-data/workspace/src/main.rs", 2),
                ("/mnt/user-data/workspace/src/main.rs", 3)
            ]
        );
        let bad = expect_code(
            c.grep(req(ALICE_KEY, GrepRequest { thread_id: T.into(), pattern: "(".into(), ..Default::default() })).await,
            Code::InvalidArgument,
            "regex",
        );
        assert!(bad.message().starts_with("pattern: invalid regex"), "{}", bad.message());
        Ok(())
    })
    .await
}

#[tokio::test]
async fn download_streams_what_snapshot_hashes() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("files:\n  download_max_bytes: 100000").await?;
        let mut c = server.client().await?;
        common::acquire(&mut c, ALICE_KEY, T).await?;
        let content: String = (0..5000).map(|i| format!("{i},")).collect();
        common::write(&mut c, ALICE_KEY, T, "/mnt/user-data/outputs/report.csv", &content).await?;
        let mut stream = c
            .download_file(req(
                ALICE_KEY,
                DownloadFileRequest { thread_id: T.into(), path: "/mnt/user-data/outputs/report.csv".into(), chunk_size: 1000 },
            ))
            .await?
            .into_inner();
        let (mut header, mut bytes, mut trailer, mut chunks) = (None, Vec::new(), None, 0);
        while let Some(message) = stream.message().await? {
            match message.payload {
                Some(download_file_response::Payload::Header(h)) => header = Some(h),
                Some(download_file_response::Payload::Chunk(c)) => {
                    assert!(c.len() <= 1000);
                    chunks += 1;
                    bytes.extend(c)
                }
                Some(download_file_response::Payload::Trailer(t)) => trailer = Some(t),
                None => anyhow::bail!("empty message"),
            }
        }
        let (header, trailer) = (header.unwrap_or_default(), trailer.unwrap_or_default());
        assert_eq!(bytes, content.as_bytes());
        assert!(chunks > 1);
        assert_eq!((header.size_bytes, header.mime_type.as_str()), (content.len() as u64, "text/csv"));
        let sha = hex::encode(sha2::Sha256::digest(content.as_bytes()));
        assert_eq!(trailer.sha256, sha);

        let snapshot = c.snapshot_outputs(req(ALICE_KEY, SnapshotOutputsRequest { thread_id: T.into() })).await?.into_inner();
        assert_eq!(snapshot.files.len(), 1);
        assert_eq!(
            (snapshot.files[0].path.as_str(), snapshot.files[0].sha256.as_str()),
            ("/mnt/user-data/outputs/report.csv", sha.as_str())
        );
        assert_eq!(snapshot.total_bytes, content.len() as u64);

        let big = "x".repeat(100_001);
        common::write(&mut c, ALICE_KEY, T, "/mnt/user-data/outputs/big.txt", &big[..50_000]).await?;
        c.write_file(req(
            ALICE_KEY,
            WriteFileRequest {
                thread_id: T.into(),
                path: "/mnt/user-data/outputs/big.txt".into(),
                content: Some(write_file_request::Content::Text(big[50_000..].into())),
                append: true,
            },
        ))
        .await?;
        let over = c
            .download_file(req(
                ALICE_KEY,
                DownloadFileRequest { thread_id: T.into(), path: "/mnt/user-data/outputs/big.txt".into(), chunk_size: 0 },
            ))
            .await;
        expect_code(over.map(|_| ()), Code::ResourceExhausted, "download cap");
        let skills =
            c.download_file(req(ALICE_KEY, DownloadFileRequest { thread_id: T.into(), path: "/mnt/skills/x".into(), chunk_size: 0 })).await;
        expect_code(skills.map(|_| ()), Code::PermissionDenied, "download outside user-data");
        Ok(())
    })
    .await
}
