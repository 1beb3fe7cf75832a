//! Concurrent EditFile calls on one file: each is applied exactly once (the per-path lock spans the whole
//! read-modify-write; without it, edits racing on the same content overwrite each other).

use antler_proto::sandbox::*;

use crate::common::{self, ALICE_KEY, bounded, req};

const EDITS: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_edits_of_one_file_are_all_applied_once() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("").await?;
        let mut c = server.client().await?;
        common::acquire(&mut c, ALICE_KEY, "t").await?;
        for round in 0..3 {
            let original: String = (0..EDITS).map(|i| format!("item-{i}: old\n")).collect();
            common::write(&mut c, ALICE_KEY, "t", "shared.txt", &original).await?;
            let mut tasks = Vec::new();
            for i in 0..EDITS {
                let mut client = c.clone();
                tasks.push(tokio::spawn(async move {
                    let request = EditFileRequest {
                        thread_id: "t".into(),
                        path: "shared.txt".into(),
                        old_str: format!("item-{i}: old\n"),
                        new_str: format!("item-{i}: new\n"),
                        replace_all: false,
                    };
                    client.edit_file(req(ALICE_KEY, request)).await.map(|r| r.into_inner().replacements)
                }));
            }
            for (i, task) in tasks.into_iter().enumerate() {
                let replaced = task.await?.map_err(|e| anyhow::anyhow!("round {round}, edit {i}: {e}"))?;
                assert_eq!(replaced, 1, "round {round}, edit {i}");
            }
            let after = common::read(&mut c, ALICE_KEY, "t", "shared.txt").await?.content;
            let expected: String = (0..EDITS).map(|i| format!("item-{i}: new\n")).collect();
            assert_eq!(after, expected, "round {round}: an edit was lost or applied twice");
        }
        Ok(())
    })
    .await
}
