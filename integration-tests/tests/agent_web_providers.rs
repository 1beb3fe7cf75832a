//! Each web provider of the lead agent against a double that speaks its real HTTP API
//! (`integration-tests/src/web_double.rs`): the request's method, path, auth header and body or query
//! as the API wants them, the results as title / url / snippet, and every failure — a refused key, a
//! rate limit, an outage, a provider that does not answer — as a tool error the model can read, with
//! no key in it.

use std::time::{Duration, Instant};

use antler_agent::lead::tools::ToolOutput;
use antler_agent::lead::tools::web::config::{
    FetchConfig, FetchProviderKind, ImageProviderKind, ImageSearchConfig, SearchConfig, SearchProviderKind,
};
use antler_agent::lead::tools::web::{image_search, web_fetch, web_search};
use antler_agent::lead::tools::web_fetch::Fetched;
use antler_integration_tests::web_double::{Api, Hit, Recorded, SearchDouble, hit};
use anyhow::{Result, anyhow, ensure};
use serde_json::Value;

const KEY: &str = "test-key-5f2c9a7e41d3";
const WRONG: &str = "wrong-key-0b8e3d6a9c17";

fn no_env(_: &str) -> Option<String> {
    None
}

fn hits() -> Vec<Hit> {
    vec![
        hit("Ferries return to the harbour", "https://news.example/ferries", "Service resumed on Monday after the storm."),
        hit("Harbour timetable", "https://port.example/timetable", "Departures every hour from 6:00."),
        hit("Storm report", "https://weather.example/storm", "Winds of 120 km/h closed the port."),
    ]
}

fn search_config(provider: SearchProviderKind, double: &SearchDouble, key: &str) -> SearchConfig {
    SearchConfig {
        provider,
        base_url: double.base_url(),
        api_key: key.to_owned(),
        max_results: 5,
        timeout_ms: 3_000,
        ..SearchConfig::default()
    }
}

fn results(output: &ToolOutput) -> Result<Vec<Value>> {
    ensure!(!output.is_error, "{}", output.text);
    let value: Value = serde_json::from_str(&output.text).map_err(|e| anyhow!("{e}: {}", output.text))?;
    value.as_array().cloned().ok_or_else(|| anyhow!("not a list: {}", output.text))
}

/// The answer is the first two hits, as title / url / snippet.
fn check_results(output: &ToolOutput) -> Result<()> {
    let results = results(output)?;
    ensure!(results.len() == 2, "max_results 2 gives two results: {}", output.text);
    for (result, expected) in results.iter().zip(hits()) {
        ensure!(result["title"] == expected.title && result["url"] == expected.url && result["snippet"] == expected.snippet, "{result}");
        ensure!(result.as_object().map(|o| o.len()) == Some(3), "only title, url, snippet: {result}");
    }
    Ok(())
}

/// A failed call: an `Error:` result that names the provider and `status`, carries `words`, and
/// shows no key.
fn check_error(output: &ToolOutput, provider: &str, status: &str, words: &[&str]) -> Result<()> {
    ensure!(output.is_error && output.text.starts_with("Error: web_search failed: "), "{}", output.text);
    ensure!(output.text.contains(&format!("{provider} answered HTTP {status}")), "{}", output.text);
    for word in words {
        ensure!(output.text.contains(word), "{word:?} missing from {}", output.text);
    }
    ensure!(!output.text.contains(KEY) && !output.text.contains(WRONG), "a key in the result: {}", output.text);
    Ok(())
}

/// Rate limit, outage and a provider slower than the timeout, for any provider.
async fn check_failures(provider: SearchProviderKind, double: &SearchDouble, key: &str) -> Result<()> {
    let name = provider.name();
    let tool = web_search(&search_config(provider, double, key), &no_env)?;
    check_error(&tool.answer("__429__", 2).await, name, "429", &["rate limited"])?;
    check_error(&tool.answer("__500__", 2).await, name, "500", &["try again later"])?;
    let slow = web_search(&SearchConfig { timeout_ms: 300, ..search_config(provider, double, key) }, &no_env)?;
    let started = Instant::now();
    let output = slow.answer("__slow__", 2).await;
    ensure!(started.elapsed() < Duration::from_secs(5), "the timeout was not kept: {:?}", started.elapsed());
    ensure!(
        output.is_error && output.text.contains(&format!("{name} did not answer within 300 ms (runs.lead.web.search.timeout_ms)")),
        "{}",
        output.text
    );
    Ok(())
}

fn last(double: &SearchDouble) -> Result<Recorded> {
    double.requests().pop().ok_or_else(|| anyhow!("the double saw no request"))
}

#[tokio::test]
async fn searxng_is_asked_for_json_and_its_results_come_back() -> Result<()> {
    let double = SearchDouble::start(Api::Searxng, "", hits()).await?;
    let tool = web_search(&search_config(SearchProviderKind::Searxng, &double, ""), &no_env)?;
    check_results(&tool.answer("harbour ferries", 2).await)?;
    let request = last(&double)?;
    ensure!(request.method == "GET" && request.path() == "/search", "{request:?}");
    ensure!(request.param("q").as_deref() == Some("harbour ferries") && request.param("format").as_deref() == Some("json"), "{request:?}");
    ensure!(request.header("accept") == Some("application/json"), "{request:?}");
    check_failures(SearchProviderKind::Searxng, &double, "").await
}

#[tokio::test]
async fn tavily_gets_a_bearer_key_and_a_json_body() -> Result<()> {
    let double = SearchDouble::start(Api::Tavily, KEY, hits()).await?;
    let tool = web_search(&search_config(SearchProviderKind::Tavily, &double, KEY), &no_env)?;
    check_results(&tool.answer("harbour ferries", 2).await)?;
    let request = last(&double)?;
    ensure!(request.method == "POST" && request.path() == "/search", "{request:?}");
    ensure!(request.header("authorization") == Some(format!("Bearer {KEY}").as_str()), "{request:?}");
    let body = request.json();
    ensure!(body["query"] == "harbour ferries" && body["max_results"] == 2 && body["search_depth"] == "basic", "{body}");
    let wrong = web_search(&search_config(SearchProviderKind::Tavily, &double, WRONG), &no_env)?;
    check_error(&wrong.answer("x", 2).await, "tavily", "401", &["missing or invalid API key", "runs.lead.web.search.api_key"])?;
    check_failures(SearchProviderKind::Tavily, &double, KEY).await
}

#[tokio::test]
async fn brave_gets_its_subscription_token_header_and_query_parameters() -> Result<()> {
    let double = SearchDouble::start(Api::Brave, KEY, hits()).await?;
    let tool = web_search(&search_config(SearchProviderKind::Brave, &double, KEY), &no_env)?;
    check_results(&tool.answer("harbour ferries", 2).await)?;
    let request = last(&double)?;
    ensure!(request.method == "GET" && request.path() == "/res/v1/web/search", "{request:?}");
    ensure!(request.header("x-subscription-token") == Some(KEY), "{request:?}");
    ensure!(request.param("q").as_deref() == Some("harbour ferries") && request.param("count").as_deref() == Some("2"), "{request:?}");
    let wrong = web_search(&search_config(SearchProviderKind::Brave, &double, WRONG), &no_env)?;
    check_error(&wrong.answer("x", 2).await, "brave", "401", &["SUBSCRIPTION_TOKEN_INVALID", "runs.lead.web.search.api_key"])?;
    check_failures(SearchProviderKind::Brave, &double, KEY).await
}

#[tokio::test]
async fn serper_gets_its_api_key_header_and_q_num() -> Result<()> {
    let double = SearchDouble::start(Api::Serper, KEY, hits()).await?;
    let tool = web_search(&search_config(SearchProviderKind::Serper, &double, KEY), &no_env)?;
    check_results(&tool.answer("harbour ferries", 2).await)?;
    let request = last(&double)?;
    ensure!(request.method == "POST" && request.path() == "/search" && request.header("x-api-key") == Some(KEY), "{request:?}");
    ensure!(request.header("content-type") == Some("application/json"), "{request:?}");
    let body = request.json();
    ensure!(body["q"] == "harbour ferries" && body["num"] == 2, "{body}");
    let wrong = web_search(&search_config(SearchProviderKind::Serper, &double, WRONG), &no_env)?;
    check_error(&wrong.answer("x", 2).await, "serper", "403", &["Unauthorized.", "runs.lead.web.search.api_key"])?;
    check_failures(SearchProviderKind::Serper, &double, KEY).await
}

#[tokio::test]
async fn exa_gets_its_key_header_search_type_and_highlight_size() -> Result<()> {
    let double = SearchDouble::start(Api::Exa, KEY, hits()).await?;
    let config = SearchConfig {
        search_type: Some("neural".to_owned()),
        contents_max_characters: Some(400),
        ..search_config(SearchProviderKind::Exa, &double, KEY)
    };
    let tool = web_search(&config, &no_env)?;
    check_results(&tool.answer("harbour ferries", 2).await)?;
    let request = last(&double)?;
    ensure!(request.method == "POST" && request.path() == "/search" && request.header("x-api-key") == Some(KEY), "{request:?}");
    let body = request.json();
    ensure!(body["query"] == "harbour ferries" && body["numResults"] == 2 && body["type"] == "neural", "{body}");
    ensure!(body["contents"]["highlights"]["maxCharacters"] == 400, "{body}");
    let wrong = web_search(&search_config(SearchProviderKind::Exa, &double, WRONG), &no_env)?;
    check_error(&wrong.answer("x", 2).await, "exa", "401", &["Invalid API key"])?;
    check_failures(SearchProviderKind::Exa, &double, KEY).await
}

#[tokio::test]
async fn firecrawl_search_gets_a_bearer_key_and_reads_v2_answers() -> Result<()> {
    let double = SearchDouble::start(Api::Firecrawl, KEY, hits()).await?;
    let tool = web_search(&search_config(SearchProviderKind::Firecrawl, &double, KEY), &no_env)?;
    check_results(&tool.answer("harbour ferries", 2).await)?;
    let request = last(&double)?;
    ensure!(request.method == "POST" && request.path() == "/v2/search", "{request:?}");
    ensure!(request.header("authorization") == Some(format!("Bearer {KEY}").as_str()), "{request:?}");
    let body = request.json();
    ensure!(body["query"] == "harbour ferries" && body["limit"] == 2, "{body}");
    let wrong = web_search(&search_config(SearchProviderKind::Firecrawl, &double, WRONG), &no_env)?;
    check_error(&wrong.answer("x", 2).await, "firecrawl", "401", &["Invalid token"])?;
    check_failures(SearchProviderKind::Firecrawl, &double, KEY).await
}

#[tokio::test]
async fn a_key_from_the_environment_is_used_when_the_config_has_none() -> Result<()> {
    let double = SearchDouble::start(Api::Tavily, KEY, hits()).await?;
    let lookup = |name: &str| (name == "TAVILY_API_KEY").then(|| KEY.to_owned());
    let tool = web_search(&search_config(SearchProviderKind::Tavily, &double, ""), &lookup)?;
    check_results(&tool.answer("harbour ferries", 2).await)?;
    ensure!(web_search(&search_config(SearchProviderKind::Tavily, &double, ""), &no_env).is_err(), "no key anywhere is a build error");
    Ok(())
}

fn image_config(provider: ImageProviderKind, double: &SearchDouble, key: &str) -> ImageSearchConfig {
    ImageSearchConfig { provider, base_url: double.base_url(), api_key: key.to_owned(), timeout_ms: 3_000, ..ImageSearchConfig::default() }
}

/// Two images with http(s) image and thumbnail URLs, the page they are on, and the usage hint.
fn check_images(output: &ToolOutput, sized: bool) -> Result<()> {
    ensure!(!output.is_error, "{}", output.text);
    let value: Value = serde_json::from_str(&output.text)?;
    let results = value["results"].as_array().cloned().unwrap_or_default();
    ensure!(results.len() == 2 && value["total_results"] == 2, "{value}");
    for (i, (result, expected)) in results.iter().zip(hits()).enumerate() {
        ensure!(result["title"] == expected.title && result["source_url"] == expected.url, "{result}");
        ensure!(result["image_url"] == format!("https://images.example/{i}.jpg"), "{result}");
        ensure!(result["thumbnail_url"] == format!("https://thumbs.example/{i}.jpg"), "{result}");
        if sized {
            ensure!(result["width"] == 1280 && result["height"] == 720, "{result}");
        }
    }
    ensure!(value["usage_hint"].as_str().is_some_and(|h| h.contains("view_image")), "{value}");
    Ok(())
}

#[tokio::test]
async fn image_search_reads_brave_serper_and_searxng_images() -> Result<()> {
    let brave = SearchDouble::start(Api::Brave, KEY, hits()).await?;
    let config = ImageSearchConfig {
        country: Some("US".to_owned()),
        safesearch: Some("strict".to_owned()),
        ..image_config(ImageProviderKind::Brave, &brave, KEY)
    };
    check_images(&image_search(&config, &no_env)?.answer("red fox", 2).await, true)?;
    let request = last(&brave)?;
    ensure!(request.path() == "/res/v1/images/search" && request.header("x-subscription-token") == Some(KEY), "{request:?}");
    ensure!(request.param("country").as_deref() == Some("US") && request.param("safesearch").as_deref() == Some("strict"), "{request:?}");
    let wrong = image_search(&image_config(ImageProviderKind::Brave, &brave, WRONG), &no_env)?.answer("red fox", 2).await;
    ensure!(wrong.is_error && wrong.text.contains("brave answered HTTP 401") && !wrong.text.contains(WRONG), "{}", wrong.text);

    let serper = SearchDouble::start(Api::Serper, KEY, hits()).await?;
    check_images(&image_search(&image_config(ImageProviderKind::Serper, &serper, KEY), &no_env)?.answer("red fox", 2).await, true)?;
    let request = last(&serper)?;
    ensure!(request.method == "POST" && request.path() == "/images" && request.json()["num"] == 2, "{request:?}");

    let searxng = SearchDouble::start(Api::Searxng, "", hits()).await?;
    let config = ImageSearchConfig { safesearch: Some("moderate".to_owned()), ..image_config(ImageProviderKind::Searxng, &searxng, "") };
    check_images(&image_search(&config, &no_env)?.answer("red fox", 2).await, true)?;
    let request = last(&searxng)?;
    ensure!(request.param("categories").as_deref() == Some("images") && request.param("safesearch").as_deref() == Some("1"), "{request:?}");
    Ok(())
}

fn reader_config(provider: FetchProviderKind, double: &SearchDouble, key: &str) -> FetchConfig {
    FetchConfig { provider, base_url: double.base_url(), api_key: key.to_owned(), timeout_ms: 3_000, ..FetchConfig::default() }
}

fn text(fetched: Result<Fetched, String>) -> Result<String> {
    match fetched {
        Ok(Fetched::Text(text)) => Ok(text),
        Ok(other) => Err(anyhow!("not text: {other:?}")),
        Err(error) => Err(anyhow!("{error}")),
    }
}

#[tokio::test]
async fn jina_and_firecrawl_read_pages_for_us_and_the_url_is_still_checked() -> Result<()> {
    // A public address written as a literal: nothing to resolve, so the test never touches DNS.
    let page = "https://93.184.215.14/harbour";
    let jina = SearchDouble::start(Api::Jina, KEY, Vec::new()).await?;
    let tool = web_fetch(&reader_config(FetchProviderKind::Jina, &jina, KEY), &no_env)?;
    let out = text(tool.fetch(page).await)?;
    ensure!(out.starts_with("# Read by Jina\n\nSource: https://93.184.215.14/harbour\n\nJina read https://93.184.215.14/harbour"), "{out}");
    let request = last(&jina)?;
    ensure!(request.method == "POST" && request.path() == "/" && request.json()["url"] == page, "{request:?}");
    ensure!(request.header("authorization") == Some(format!("Bearer {KEY}").as_str()), "{request:?}");
    ensure!(request.header("x-return-format") == Some("markdown") && request.header("x-timeout") == Some("3"), "{request:?}");
    // Jina works without a key (at a lower rate limit): no Authorization header at all.
    let keyless = web_fetch(&reader_config(FetchProviderKind::Jina, &jina, ""), &no_env)?;
    text(keyless.fetch(page).await)?;
    ensure!(last(&jina)?.header("authorization").is_none(), "no key, no header");
    let wrong = web_fetch(&reader_config(FetchProviderKind::Jina, &jina, WRONG), &no_env)?.fetch(page).await;
    let wrong = wrong.err().unwrap_or_default();
    ensure!(
        wrong.starts_with("Error: web_fetch jina answered HTTP 401") && wrong.contains("Invalid API key") && !wrong.contains(WRONG),
        "{wrong}"
    );

    let seen = jina.requests().len();
    let refused = tool.fetch("http://169.254.169.254/latest/meta-data/").await.err().unwrap_or_default();
    ensure!(refused.contains("rule `link-local`") && refused.contains("cloud metadata"), "{refused}");
    ensure!(jina.requests().len() == seen, "a refused URL is never sent to the reader");

    let firecrawl = SearchDouble::start(Api::Firecrawl, KEY, Vec::new()).await?;
    let tool = web_fetch(&reader_config(FetchProviderKind::Firecrawl, &firecrawl, KEY), &no_env)?;
    let out = text(tool.fetch(page).await)?;
    ensure!(out.starts_with("# Scraped by Firecrawl\n\nSource: https://93.184.215.14/harbour\n\nFirecrawl scraped"), "{out}");
    let request = last(&firecrawl)?;
    ensure!(request.path() == "/v2/scrape" && request.json()["formats"] == serde_json::json!(["markdown"]), "{request:?}");
    let wrong = web_fetch(&reader_config(FetchProviderKind::Firecrawl, &firecrawl, WRONG), &no_env)?.fetch(page).await;
    ensure!(wrong.err().unwrap_or_default().contains("firecrawl answered HTTP 401"), "a refused key is a readable error");
    Ok(())
}
