//! Integration tests: a real sandbox gRPC server per test (in-process, on 127.0.0.1:0, with the kit's
//! auth and limits and two API-key users), driven by the generated client.

mod bwrap;
mod common;
mod concurrency;
mod exec;
mod fencing;
mod files;
mod hostile_paths;
mod lifecycle;
mod seccomp;
mod skills;
mod uploads;
