//! The mark of calls this process makes to itself (`antler up`: every service on one server).
//!
//! A request carrying [`INTERNAL_HEADER`] with [`internal_mark`] comes from this very process: the
//! value is 128 random bits from the kernel, made at start-up and sent only to this process's own
//! listener (the clients whose endpoint is empty, see [`crate::client`]), so no other client can
//! present it. Two layers read it: the concurrency limit (internal calls have a budget of their own)
//! and authentication (an internal call without a token acts for the user it names, so services in
//! one process need no `service_token` between them).

/// The metadata key that marks a call made by this process to itself.
pub const INTERNAL_HEADER: &str = "x-antler-internal";

/// The value of [`INTERNAL_HEADER`] for this process: 128 random bits from the kernel, never sent
/// anywhere but to this process's own listener, so another client cannot claim it.
pub fn internal_mark() -> &'static str {
    static MARK: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let mut bytes = [0u8; 16];
        let random = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
        if random.is_err() {
            // No /dev/urandom: std's hasher keys come from the OS's randomness too.
            use std::hash::BuildHasher;
            let half = || std::collections::hash_map::RandomState::new().hash_one(0u8).to_le_bytes();
            bytes[..8].copy_from_slice(&half());
            bytes[8..].copy_from_slice(&half());
        }
        hex::encode(bytes)
    });
    &MARK
}

/// Whether `value` (of [`INTERNAL_HEADER`]) is this process's mark, compared in constant time.
pub fn is_mark(value: Option<&[u8]>) -> bool {
    value.is_some_and(|v| {
        use subtle::ConstantTimeEq;
        v.ct_eq(internal_mark().as_bytes()).into()
    })
}
