//! Which dialect a request speaks, from its method, path and query: the routing table of
//! the LLM APIs tokentap measures (the dialect's module has the rules of its responses).

use super::types::Dialect;

/// The dialect of an LLM route, or `None` for a route tokentap does not measure.
///
/// Matched on the path's end so that base paths work (`/openai/v1/chat/completions`,
/// Azure's `/openai/deployments/x/chat/completions`, a gateway's `/ollama/api/chat`).
/// Only `POST` requests are LLM calls, except the Responses API's
/// `GET …/responses/{id}?stream=true`, which replays a stored response as a stream.
///
/// `method` is the request's method as written (`http::Method` is one: this crate
/// depends on no HTTP library), compared exactly, as methods are case-sensitive.
pub fn dialect_for<M: AsRef<str> + ?Sized>(
    method: &M,
    path: &str,
    query: Option<&str>,
) -> Option<Dialect> {
    let method = method.as_ref();
    let path = path.trim_end_matches('/');
    if method == "GET" {
        let streamed = query.is_some_and(|q| {
            q.split('&')
                .any(|pair| pair.eq_ignore_ascii_case("stream=true"))
        });
        let is_response = path
            .rsplit_once('/')
            .is_some_and(|(parent, id)| parent.ends_with("/responses") && !id.is_empty());
        return (streamed && is_response).then_some(Dialect::OpenAiResponses);
    }
    if method != "POST" {
        return None;
    }
    let dialect = if path.ends_with("/chat/completions") {
        Dialect::OpenAiChat
    } else if path.ends_with("/completions") {
        Dialect::OpenAiCompletions
    } else if path.ends_with("/responses") {
        Dialect::OpenAiResponses
    } else if path.ends_with("/v1/messages")
        || (path.contains("/publishers/anthropic/models/")
            && (path.ends_with(":streamRawPredict") || path.ends_with(":rawPredict")))
    {
        Dialect::Anthropic
    } else if path.ends_with(":streamGenerateContent") || path.ends_with(":generateContent") {
        Dialect::Gemini
    } else if path.ends_with("/api/chat") || path.ends_with("/api/generate") {
        Dialect::Ollama
    } else if path.ends_with("/generate_stream") || path.ends_with("/generate") {
        if path.contains("/v2/models/") {
            Dialect::Triton
        } else {
            Dialect::Tgi
        }
    } else {
        return None;
    };
    Some(dialect)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn routes() {
        let post = Method::POST;
        let cases: &[(&str, Option<Dialect>)] = &[
            ("/v1/chat/completions", Some(Dialect::OpenAiChat)),
            ("/openai/deployments/gpt/chat/completions/", Some(Dialect::OpenAiChat)),
            ("/v1/completions", Some(Dialect::OpenAiCompletions)),
            ("/v1/responses", Some(Dialect::OpenAiResponses)),
            ("/v1/messages", Some(Dialect::Anthropic)),
            ("/anthropic/v1/messages", Some(Dialect::Anthropic)),
            (
                "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4:streamRawPredict",
                Some(Dialect::Anthropic),
            ),
            ("/v1/threads/t_1/messages", None),
            ("/v1/messages/count_tokens", None),
            ("/v1beta/models/gemini-2.0-flash:streamGenerateContent", Some(Dialect::Gemini)),
            ("/v1beta/models/gemini-2.0-flash:generateContent", Some(Dialect::Gemini)),
            (
                "/v1/projects/p/locations/l/publishers/google/models/gemini-2.5-pro:streamGenerateContent",
                Some(Dialect::Gemini),
            ),
            ("/v1beta/models/gemini-2.0-flash:countTokens", None),
            ("/api/chat", Some(Dialect::Ollama)),
            ("/ollama/api/generate", Some(Dialect::Ollama)),
            ("/api/tags", None),
            ("/generate_stream", Some(Dialect::Tgi)),
            ("/generate", Some(Dialect::Tgi)),
            ("/v2/models/ensemble/generate_stream", Some(Dialect::Triton)),
            ("/v2/models/llama/versions/1/generate", Some(Dialect::Triton)),
            ("/v2/models/llama/infer", None),
            ("/v1/models", None),
            ("/v1/embeddings", None),
        ];
        for (path, want) in cases {
            assert_eq!(dialect_for(&post, path, None), *want, "{path}");
        }
        assert_eq!(
            dialect_for(&Method::GET, "/v1/chat/completions", None),
            None
        );
        assert_eq!(
            dialect_for(
                &Method::GET,
                "/v1/responses/resp_1",
                Some("stream=true&starting_after=4")
            ),
            Some(Dialect::OpenAiResponses)
        );
        assert_eq!(
            dialect_for(&Method::GET, "/v1/responses/resp_1", None),
            None
        );
        assert_eq!(
            dialect_for(&Method::DELETE, "/v1/responses/resp_1", None),
            None
        );
    }
}
