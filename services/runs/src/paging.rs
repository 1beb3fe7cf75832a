//! Stable cursors for newest-first listings: a token names the last item returned (its creation
//! time and id), so inserts between pages neither repeat nor skip items.

use crate::error::RunsError;

pub const DEFAULT_PAGE: u32 = 50;
pub const MAX_PAGE: u32 = 200;

/// Clamps a requested page size (0 → default).
pub fn size(requested: u32, default: u32, max: u32) -> u64 {
    u64::from(if requested == 0 { default } else { requested.min(max) })
}

pub fn encode(created_at: i64, id: &str) -> String {
    hex::encode(format!("{created_at}:{id}"))
}

pub fn decode(token: &str, field: &str) -> Result<Option<(i64, String)>, RunsError> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || RunsError::invalid(field, "is not a token returned by this service");
    let bytes = hex::decode(token).map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (at, id) = text.split_once(':').ok_or_else(bad)?;
    Ok(Some((at.parse().map_err(|_| bad())?, id.to_owned())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_garbage_is_refused() {
        let token = encode(1_700_000_000_000, "t-1");
        assert!(matches!(decode(&token, "page.page_token"), Ok(Some((1_700_000_000_000, ref id))) if id == "t-1"));
        assert!(decode("zz", "page.page_token").is_err());
        assert!(matches!(decode("", "page.page_token"), Ok(None)));
    }
}
