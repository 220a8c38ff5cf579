//! Request inspection: which API a request speaks and which tenant sent it, from the
//! request head alone (the model comes from the body, scanned as it streams upstream).
//!
//! Nothing read here is stored raw: the tenant passes the label policy before it becomes
//! a label, and API keys are only ever hashed.

use http::request::Parts;
use http::{HeaderMap, Method};
use sha2::{Digest, Sha256};

use crate::config::TenantSource;
use crate::wire::{self, Dialect};

/// What the request head says about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    /// The API dialect, or `None` for a route tokentap does not measure.
    pub dialect: Option<Dialect>,
    pub tenant: Option<String>,
}

/// Inspect a request head.
pub fn inspect(parts: &Parts, sources: &[TenantSource]) -> RequestInfo {
    RequestInfo {
        dialect: wire::dialect_for(&parts.method, parts.uri.path(), parts.uri.query()),
        tenant: tenant_for(&parts.headers, sources),
    }
}

/// The dialect of an LLM route, from its method and path (no query): see
/// [`wire::dialect_for`], which owns the routing table.
pub fn dialect_for(method: &Method, path: &str) -> Option<Dialect> {
    wire::dialect_for(method, path, None)
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
