//! Request inspection: which API a request speaks (so whether it is measured at all) and
//! which tenant sent it, from the request head alone (the model comes from the body,
//! scanned as it streams upstream). It lives in `observe` because it decides what is
//! measured; the proxy only routes bytes.
//!
//! Nothing read here is stored raw: the tenant passes the label policy before it becomes
//! a label, and API keys are only ever hashed.

use http::{HeaderMap, Method};
use sha2::{Digest, Sha256};

use crate::config::{Route, TenantSource};
use crate::wire::{self, Dialect};

/// The dialect of a request. The first route whose prefix matches the path decides:
/// `dialect: none` forwards the request unobserved whatever its method; a dialect applies
/// to `POST`s, and other methods are detected from the path as without the route (which
/// finds only the Responses API's `GET …/responses/{id}?stream=true`). A path no route
/// matches is detected by [`wire::dialect_for`].
pub fn routed_dialect(
    routes: &[Route],
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Option<Dialect> {
    match routes.iter().find(|route| route.matches(path)) {
        Some(route) => {
            let forced = route.dialect?;
            if method == Method::POST {
                Some(forced)
            } else {
                wire::dialect_for(method, path, query)
            }
        }
        None => wire::dialect_for(method, path, query),
    }
}

/// The tenant from the first configured source that yields one.
pub fn tenant_for(headers: &HeaderMap, sources: &[TenantSource]) -> Option<String> {
    sources.iter().find_map(|source| match source {
        TenantSource::Header(name) => headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string),
        TenantSource::ApiKeys(by_hash) => {
            let key = api_key(headers)?;
            let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
            by_hash.get(&digest).cloned()
        }
    })
}

/// The API key a client presented: `Authorization: Bearer`, `x-api-key` (Anthropic) or
/// `api-key` (Azure OpenAI).
fn api_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(auth) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let mut parts = auth.splitn(2, ' ');
        if let (Some(scheme), Some(token)) = (parts.next(), parts.next()) {
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() {
                return Some(token.trim());
            }
        }
    }
    ["x-api-key", "api-key"]
        .iter()
        .find_map(|name| headers.get(*name).and_then(|v| v.to_str().ok()))
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn dialect_from_path() {
        // Without routes, the path decides (`wire::dialect_for`, no query).
        let dialect_for = |method: &Method, path: &str| routed_dialect(&[], method, path, None);
        let post = Method::POST;
        assert_eq!(
            dialect_for(&post, "/v1/chat/completions"),
            Some(Dialect::OpenAiChat)
        );
        assert_eq!(
            dialect_for(&post, "/v1/completions"),
            Some(Dialect::OpenAiCompletions)
        );
        assert_eq!(
            dialect_for(&post, "/openai/deployments/gpt/chat/completions/"),
            Some(Dialect::OpenAiChat)
        );
        assert_eq!(dialect_for(&Method::GET, "/v1/chat/completions"), None);
        assert_eq!(dialect_for(&post, "/v1/models"), None);
        assert_eq!(dialect_for(&post, "/v1/embeddings"), None);
    }

    #[test]
    fn routes_decide_before_path_detection() {
        use crate::config::Route;
        let routes = [
            Route {
                path_prefix: "/my/llm".into(),
                dialect: Some(Dialect::Anthropic),
            },
            Route {
                path_prefix: "/private".into(),
                dialect: None,
            },
        ];
        let post = Method::POST;
        let get = Method::GET;
        let at = |method: &Method, path: &str, query: Option<&str>| {
            routed_dialect(&routes, method, path, query)
        };
        // Forced, whatever the path looks like.
        assert_eq!(at(&post, "/my/llm", None), Some(Dialect::Anthropic));
        assert_eq!(
            at(&post, "/my/llm/v1/chat/completions", None),
            Some(Dialect::Anthropic)
        );
        // Other methods under a forced prefix: detected as usual.
        assert_eq!(at(&get, "/my/llm/v1/models", None), None);
        assert_eq!(
            at(&get, "/my/llm/v1/responses/r1", Some("stream=true")),
            Some(Dialect::OpenAiResponses)
        );
        // `none`: never observed, even an LLM-shaped path.
        assert_eq!(at(&post, "/private/v1/chat/completions", None), None);
        assert_eq!(
            at(&get, "/private/v1/responses/r1", Some("stream=true")),
            None
        );
        // Not a segment boundary, or no route: path detection.
        assert_eq!(
            at(&post, "/my/llmx/v1/chat/completions", None),
            Some(Dialect::OpenAiChat)
        );
        assert_eq!(at(&post, "/api/chat", None), Some(Dialect::Ollama));
        assert_eq!(at(&post, "/my/llmx", None), None);
    }

    #[test]
    fn tenant_from_header_then_api_key() {
        let key = "sk-secret-123";
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let sources = vec![
            TenantSource::Header(http::HeaderName::from_static("x-tenant-id")),
            TenantSource::ApiKeys(HashMap::from([(digest, "team-a".to_string())])),
        ];
        let mut headers = HeaderMap::new();
        headers.insert("authorization", format!("Bearer {key}").parse().unwrap());
        assert_eq!(tenant_for(&headers, &sources), Some("team-a".into()));
        headers.insert("x-tenant-id", "explicit".parse().unwrap());
        assert_eq!(tenant_for(&headers, &sources), Some("explicit".into()));

        let mut other = HeaderMap::new();
        other.insert("x-api-key", "sk-unknown".parse().unwrap());
        assert_eq!(tenant_for(&other, &sources), None);
        other.insert("x-api-key", key.parse().unwrap());
        assert_eq!(tenant_for(&other, &sources), Some("team-a".into()));
    }
}
