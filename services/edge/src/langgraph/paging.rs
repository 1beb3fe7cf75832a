//! Offset / limit windows over the gRPC lists' page tokens: LangGraph pages by offset, Antler's lists
//! by opaque tokens.

use std::future::Future;

use antler_proto::common::PageRequest;

use crate::error::ApiError;

/// gRPC page size while walking to the offset (the lists' maximum).
const PAGE_SIZE: u32 = 200;

/// Items `offset .. offset + limit` of a paged list. `fetch` returns one page's items and the next
/// page token (empty at the end). Both bounds come from `edge.max_offset` / `edge.max_page`.
pub async fn window<T, F, Fut>(offset: usize, limit: usize, mut fetch: F) -> Result<Vec<T>, ApiError>
where
    F: FnMut(PageRequest) -> Fut,
    Fut: Future<Output = Result<(Vec<T>, String), ApiError>>,
{
    let (mut found, mut skipped, mut token) = (Vec::new(), 0, String::new());
    loop {
        let (items, next) = fetch(PageRequest { page_size: PAGE_SIZE, page_token: token }).await?;
        for item in items {
            if skipped < offset {
                skipped += 1;
            } else if found.len() < limit {
                found.push(item);
            }
        }
        token = next;
        if token.is_empty() || found.len() >= limit {
            return Ok(found);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_window_skips_the_offset_across_pages_and_stops_at_the_limit() {
        let pages = [vec![1, 2, 3], vec![4, 5, 6], vec![7]];
        let mut asked = 0;
        let got = window(2, 3, |page| {
            let index: usize = page.page_token.parse().unwrap_or(0);
            asked += 1;
            let next = if index + 1 < pages.len() { (index + 1).to_string() } else { String::new() };
            let items = pages[index].clone();
            async move { Ok((items, next)) }
        })
        .await
        .unwrap_or_default();
        assert_eq!(got, vec![3, 4, 5]);
        assert_eq!(asked, 2, "the third page is not fetched");
        let all = window(0, 100, |page| {
            let index: usize = page.page_token.parse().unwrap_or(0);
            let next = if index + 1 < pages.len() { (index + 1).to_string() } else { String::new() };
            let items = pages[index].clone();
            async move { Ok((items, next)) }
        })
        .await
        .unwrap_or_default();
        assert_eq!(all, vec![1, 2, 3, 4, 5, 6, 7]);
    }
}
