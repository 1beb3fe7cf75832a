//! Conversions between stored milliseconds and protobuf timestamps.

pub fn to_timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: ms.div_euclid(1000), nanos: (ms.rem_euclid(1000) * 1_000_000) as i32 }
}

pub fn opt_timestamp(ms: Option<i64>) -> Option<prost_types::Timestamp> {
    ms.map(to_timestamp)
}
