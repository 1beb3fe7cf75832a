//! Compiles every `.proto` under the workspace `proto/` folder into Rust (prost + tonic) and writes the
//! encoded descriptor set that server reflection serves.
//!
//! protoc comes from `protoc-bin-vendored` so a fresh machine needs no system package; a `PROTOC`
//! set in the environment wins, for distributions that insist on their own.

use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("../../proto").canonicalize()?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
        #[allow(unsafe_code)]
        unsafe {
            std::env::set_var("PROTOC", protoc)
        };
    }

    let mut files = Vec::new();
    collect_protos(&proto_root, &mut files)?;
    files.sort();
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    println!("cargo:rerun-if-changed={}", proto_root.display());
    println!("cargo:rerun-if-env-changed=PROTOC");

    tonic_prost_build::configure()
        .codec_path("crate::codec::LeanCodec")
        .file_descriptor_set_path(out_dir.join("antler_descriptor.bin"))
        .compile_protos(&files, &[proto_root])?;
    Ok(())
}

fn collect_protos(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_protos(&path, out)?;
        } else if path.extension().is_some_and(|ext| ext == "proto") {
            out.push(path);
        }
    }
    Ok(())
}
