//! Antler's protobuf contracts as Rust types, tonic clients and tonic servers.
//!
//! The `.proto` files under `proto/` are the source of truth (and what other languages bind to); this
//! crate only compiles them. [`FILE_DESCRIPTOR_SET`] feeds server reflection, so `grpcurl describe`
//! shows the proto comments without any `.proto` file at hand.

#![allow(clippy::all, missing_docs)]

pub mod codec;

pub mod antler {
    pub mod common {
        pub mod v1 {
            tonic::include_proto!("antler.common.v1");
        }
    }
    pub mod runs {
        pub mod v1 {
            tonic::include_proto!("antler.runs.v1");
        }
    }
    pub mod sandbox {
        pub mod v1 {
            tonic::include_proto!("antler.sandbox.v1");
        }
    }
    pub mod mcp {
        pub mod v1 {
            tonic::include_proto!("antler.mcp.v1");
        }
    }
    pub mod models {
        pub mod v1 {
            tonic::include_proto!("antler.models.v1");
        }
    }
    pub mod memory {
        pub mod v1 {
            tonic::include_proto!("antler.memory.v1");
        }
    }
}

pub use antler::{
    common::v1 as common, mcp::v1 as mcp, memory::v1 as memory, models::v1 as models, runs::v1 as runs, sandbox::v1 as sandbox,
};

/// Encoded `FileDescriptorSet` of every Antler proto file, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("antler_descriptor");
