//! tokentap's figures under the OpenTelemetry GenAI semantic conventions' metric names
//! (`metrics.names: gen_ai` or `both`), as Prometheus translates them: dots become
//! underscores and the unit `s` a `_seconds` suffix, so `gen_ai.server.time_to_first_token`
//! is `gen_ai_server_time_to_first_token_seconds{gen_ai_request_model="…"}`.
//!
//! Each family is the tokentap figure whose definition matches the convention's, with
//! the convention's attributes and its recommended bucket boundaries as the classic
//! buckets (native buckets and exemplars as tokentap's own families have them). Where
//! the definitions differ, the convention's wins and tokentap's figure is filtered to it:
//!
//! | GenAI family | tokentap's figure | difference |
//! |---|---|---|
//! | `gen_ai.server.time_to_first_token` | TTFT | successful (`completed`) requests only |
//! | `gen_ai.server.time_per_output_token` | TPOT | successful requests only |
//! | `gen_ai.server.request.duration` | request duration | `error.type` = the outcome of a request that did not complete |
//! | `gen_ai.client.operation.time_to_first_chunk` | TTFT | streamed requests, every outcome, observed as the first token-bearing event arrives |
//! | `gen_ai.client.operation.time_per_output_chunk` | inter-chunk latency | streamed requests, every gap as it happens |
//! | `gen_ai.client.token.usage` | input/output tokens | a histogram per request and `gen_ai.token.type`, where tokentap counted them |
//!
//! The series are kept per attribute set (operation, provider, model, and `error.type`
//! or `gen_ai.token.type` where the family has it) in sets of their own, apart from the
//! (model, tenant) pairs, and carry no `tenant`: the convention has no such attribute.
//! `server.address` and `server.port` are left out: one tokentap has one upstream, and
//! the scrape's own target labels say which.

use std::sync::Arc;

use super::text::escape_label_value;

/// `metrics.names`: the names the latency histograms and token counts go by on `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MetricNames {
    /// `tokentap_` only (the default: what the shipped dashboards and rules read).
    #[default]
    Tokentap,
    /// The GenAI families instead of the `tokentap_` families they stand for
    /// ([`REPLACED`]); the `tokentap_` families without a GenAI equivalent stay.
    GenAi,
    /// Both.
    Both,
}

impl MetricNames {
    pub const ALL: [MetricNames; 3] =
        [MetricNames::Tokentap, MetricNames::GenAi, MetricNames::Both];

    pub const fn as_str(self) -> &'static str {
        match self {
            MetricNames::Tokentap => "tokentap",
            MetricNames::GenAi => "gen_ai",
            MetricNames::Both => "both",
        }
    }

    /// Whether the GenAI families are exposed.
    pub const fn gen_ai(self) -> bool {
        matches!(self, MetricNames::GenAi | MetricNames::Both)
    }

    /// Whether `family` (a `tokentap_` per-pair family) is exposed.
    pub fn exposes(self, family: &str) -> bool {
        self != MetricNames::GenAi || !REPLACED.iter().any(|(_, replaced)| *replaced == family)
    }
}

/// The convention's recommended boundaries.
pub mod buckets {
    /// `gen_ai.server.time_to_first_token`.
    pub const TIME_TO_FIRST_TOKEN: &[f64] = &[
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    ];
    /// `gen_ai.server.time_per_output_token`.
    pub const TIME_PER_OUTPUT_TOKEN: &[f64] = &[
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    ];
    /// `gen_ai.server.request.duration` and both client chunk metrics.
    pub const DURATION: &[f64] = &[
        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
    ];
    /// `gen_ai.client.token.usage`.
    pub const TOKEN_USAGE: &[f64] = &[
        1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
        4194304.0, 16777216.0, 67108864.0,
    ];
}

/// The bounds the GenAI sets' histograms are built with.
pub(super) struct GenAiBounds {
    pub time_to_first_token: Arc<[f64]>,
    pub time_per_output_token: Arc<[f64]>,
    pub duration: Arc<[f64]>,
    pub token_usage: Arc<[f64]>,
}

impl Default for GenAiBounds {
    fn default() -> GenAiBounds {
        GenAiBounds {
            time_to_first_token: Arc::from(buckets::TIME_TO_FIRST_TOKEN),
            time_per_output_token: Arc::from(buckets::TIME_PER_OUTPUT_TOKEN),
            duration: Arc::from(buckets::DURATION),
            token_usage: Arc::from(buckets::TOKEN_USAGE),
        }
    }
}

/// The attributes of one GenAI set, in label-name order. `error_type` and `token_type`
/// mark the sets that hold only the duration of failed requests, or only token usage.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct GenAiKey {
    pub error_type: Option<&'static str>,
    pub operation: &'static str,
    pub provider: &'static str,
    pub model: Arc<str>,
    pub token_type: Option<&'static str>,
}

impl GenAiKey {
    /// The set's labels as the text exposition writes them, escaped, in name order.
    pub fn label_text(&self) -> String {
        let mut text = String::new();
        for (name, value) in self.labels() {
            if !text.is_empty() {
                text.push(',');
            }
            text.push_str(name);
            text.push_str("=\"");
            escape_label_value(value, &mut text);
            text.push('"');
        }
        text
    }

    /// The value of label `name`, if the set has it.
    pub fn value(&self, name: &str) -> Option<Arc<str>> {
        self.labels()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| Arc::from(v))
    }

    fn labels(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("error_type", self.error_type),
            ("gen_ai_operation_name", Some(self.operation)),
            ("gen_ai_provider_name", Some(self.provider)),
            ("gen_ai_request_model", Some(&*self.model)),
            ("gen_ai_token_type", self.token_type),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
    }
}

/// `(GenAI family, tokentap family)`: which `tokentap_` family each GenAI family stands
/// for, and so which `metrics.names: gen_ai` leaves out. The token counters are replaced
/// by the usage histogram, whose `_sum` is their total.
pub const REPLACED: [(&str, &str); 7] = [
    (
        "gen_ai_server_time_to_first_token_seconds",
        "tokentap_time_to_first_token_seconds",
    ),
    (
        "gen_ai_server_time_per_output_token_seconds",
        "tokentap_time_per_output_token_seconds",
    ),
    (
        "gen_ai_server_request_duration_seconds",
        "tokentap_request_duration_seconds",
    ),
    (
        "gen_ai_client_operation_time_per_output_chunk_seconds",
        "tokentap_inter_chunk_latency_seconds",
    ),
    ("gen_ai_client_token_usage", "tokentap_output_tokens_total"),
    ("gen_ai_client_token_usage", "tokentap_input_tokens_total"),
    (
        "gen_ai_client_operation_time_to_first_chunk_seconds",
        "tokentap_time_to_first_token_seconds",
    ),
];

/// The OpenTelemetry name and unit of a GenAI family's Prometheus name, and its
/// attributes' names: what the OTLP push sends it as.
pub fn otel_name(prometheus_name: &str) -> Option<(&'static str, &'static str)> {
    Some(match prometheus_name {
        "gen_ai_client_operation_time_per_output_chunk_seconds" => {
            ("gen_ai.client.operation.time_per_output_chunk", "s")
        }
        "gen_ai_client_operation_time_to_first_chunk_seconds" => {
            ("gen_ai.client.operation.time_to_first_chunk", "s")
        }
        "gen_ai_client_token_usage" => ("gen_ai.client.token.usage", "{token}"),
        "gen_ai_server_request_duration_seconds" => ("gen_ai.server.request.duration", "s"),
        "gen_ai_server_time_per_output_token_seconds" => {
            ("gen_ai.server.time_per_output_token", "s")
        }
        "gen_ai_server_time_to_first_token_seconds" => ("gen_ai.server.time_to_first_token", "s"),
        _ => return None,
    })
}

/// The OpenTelemetry attribute a GenAI family's label stands for.
pub fn otel_attribute(label: &str) -> Option<&'static str> {
    Some(match label {
        "error_type" => "error.type",
        "gen_ai_operation_name" => "gen_ai.operation.name",
        "gen_ai_provider_name" => "gen_ai.provider.name",
        "gen_ai_request_model" => "gen_ai.request.model",
        "gen_ai_token_type" => "gen_ai.token.type",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exemplar::TraceContext;
    use crate::families::{family_names, GEN_AI_FAMILIES};
    use crate::outcome::{Outcome, StatusClass, Verdict};
    use crate::{Metrics, NativeHistograms, RequestExemplar, RequestFigures};
    use std::time::{Duration, SystemTime};

    fn metrics(names: MetricNames) -> std::sync::Arc<Metrics> {
        Metrics::with_names(
            &crate::Buckets::default(),
            &NativeHistograms::default(),
            &crate::Labels::default(),
            names,
        )
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// One completed streamed request (TTFT 150 ms, two gaps, TPOT 20 ms, 9 in / 5 out
    /// tokens, traced) and one that timed out after its first token, as the recorder
    /// records them.
    fn two_requests(metrics: &Metrics) {
        let trace = TraceContext {
            trace_id: [7; 16],
            span_id: [8; 8],
        };
        for (outcome, duration) in [(Outcome::Completed, 230), (Outcome::Timeout, 900)] {
            let mut stream = metrics.stream(Some("llama"), Some("team-a"));
            metrics.attach_gen_ai(&mut stream, "chat", "openai", true);
            stream.first_token(ms(150));
            if outcome == Outcome::Completed {
                stream.chunk_gap(ms(40));
                stream.chunk_gap(ms(40));
            }
            let figures = RequestFigures {
                duration: ms(duration),
                output_tokens: 5,
                input_tokens: Some(9),
                exact_event_tokens: 5,
                apportioned_event_tokens: 0,
                estimated_event_tokens: 0,
                tpot: Some(ms(20)),
                tokens_per_second: Some(50.0),
                exemplar: Some(RequestExemplar {
                    trace,
                    at: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
                    ttft: Some(ms(150)),
                    slowest_itl: Some(ms(20)),
                }),
            };
            // The idle timeout struck after the upstream's 200.
            let verdict = Verdict::new(outcome, StatusClass::Success);
            metrics.record_gen_ai(&stream, verdict, Some(ms(150)), &figures);
            metrics.record_request(&stream, verdict, figures);
        }
    }

    fn line<'t>(text: &'t str, start: &str) -> &'t str {
        text.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line starting {start:?} in\n{text}"))
    }

    /// `both`: each GenAI family holds the figures its definition takes, with the
    /// convention's attributes and buckets, and the `tokentap_` families are unchanged.
    #[test]
    fn the_gen_ai_families_take_what_their_definitions_say() {
        let metrics = metrics(MetricNames::Both);
        two_requests(&metrics);
        let text = String::from_utf8(metrics.render()).expect("UTF-8");
        let labels = r#"gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="llama""#;
        // Server TTFT and TPOT: the completed request only.
        assert_eq!(
            line(
                &text,
                &format!("gen_ai_server_time_to_first_token_seconds_count{{{labels}}}")
            ),
            format!("gen_ai_server_time_to_first_token_seconds_count{{{labels}}} 1")
        );
        assert!(text.contains(&format!(
            "gen_ai_server_time_to_first_token_seconds_bucket{{{labels},le=\"0.1\"}} 0\n"
        )));
        assert!(text.contains(&format!(
            "gen_ai_server_time_to_first_token_seconds_bucket{{{labels},le=\"0.25\"}} 1\n"
        )));
        assert!(text.contains(&format!(
            "gen_ai_server_time_per_output_token_seconds_count{{{labels}}} 1\n"
        )));
        // Client time to first chunk: both streamed requests, whatever their outcome.
        assert!(text.contains(&format!(
            "gen_ai_client_operation_time_to_first_chunk_seconds_count{{{labels}}} 2\n"
        )));
        assert!(text.contains(&format!(
            "gen_ai_client_operation_time_per_output_chunk_seconds_count{{{labels}}} 2\n"
        )));
        // Duration: one series without error_type, one with the timeout's.
        assert!(text.contains(&format!(
            "gen_ai_server_request_duration_seconds_count{{{labels}}} 1\n"
        )));
        assert!(text.contains(&format!(
            "gen_ai_server_request_duration_seconds_count{{error_type=\"timeout\",{labels}}} 1\n"
        )));
        assert!(text.contains(&format!(
            "gen_ai_server_request_duration_seconds_sum{{error_type=\"timeout\",{labels}}} 0.9\n"
        )));
        // Token usage: per request and token type, on the convention's boundaries.
        for (token_type, sum) in [("input", 18), ("output", 10)] {
            let series = format!("{labels},gen_ai_token_type=\"{token_type}\"");
            assert!(text.contains(&format!("gen_ai_client_token_usage_count{{{series}}} 2\n")));
            assert!(text.contains(&format!(
                "gen_ai_client_token_usage_sum{{{series}}} {sum}\n"
            )));
            assert!(text.contains(&format!(
                "gen_ai_client_token_usage_bucket{{{series},le=\"16\"}} 2\n"
            )));
        }
        assert!(!text.contains("gen_ai_token_type=\"input\",tenant"));
        // tokentap's own are all there, TTFT with both requests.
        assert!(text.contains(
            "tokentap_time_to_first_token_seconds_count{model=\"llama\",tenant=\"team-a\"} 2\n"
        ));
        // OpenMetrics: the traced request's exemplar is on the GenAI buckets too.
        let openmetrics = String::from_utf8(metrics.render_openmetrics()).expect("UTF-8");
        let bucket = line(
            &openmetrics,
            &format!("gen_ai_server_time_to_first_token_seconds_bucket{{{labels},le=\"0.25\"}}"),
        );
        assert!(bucket.contains("# {trace_id=\"07070707"), "{bucket}");
        // The snapshot (the protobuf exposition, the OTLP push) has the same series.
        let snapshot = metrics.snapshot();
        for name in family_names() {
            assert!(snapshot.family(name).is_some(), "{name} in the snapshot");
        }
    }

    #[test]
    fn the_names_switch_chooses_the_families() {
        let families = |names| {
            let metrics = metrics(names);
            two_requests(&metrics);
            let text = String::from_utf8(metrics.render()).expect("UTF-8");
            let mut found: Vec<String> = text
                .lines()
                .filter_map(|l| l.strip_prefix("# TYPE "))
                .filter_map(|l| l.split(' ').next())
                .filter(|n| n.starts_with("gen_ai_") || n.starts_with("tokentap_"))
                .map(str::to_string)
                .collect();
            found.sort();
            found
        };
        let tokentap = families(MetricNames::Tokentap);
        let gen_ai = families(MetricNames::GenAi);
        let both = families(MetricNames::Both);
        assert!(tokentap.iter().all(|n| n.starts_with("tokentap_")));
        let replaced: Vec<&str> = REPLACED.iter().map(|(_, t)| *t).collect();
        for name in &tokentap {
            assert_eq!(
                gen_ai.contains(name),
                !replaced.contains(&name.as_str()),
                "{name} under gen_ai"
            );
            assert!(both.contains(name), "{name} under both");
        }
        for name in family_names() {
            assert!(gen_ai.iter().any(|n| n == name), "{name} under gen_ai");
            assert!(both.iter().any(|n| n == name), "{name} under both");
        }
        assert!(gen_ai.contains(&"tokentap_inter_token_latency_seconds".to_string()));
    }

    #[test]
    fn a_key_writes_its_labels_in_name_order_and_escaped() {
        let key = GenAiKey {
            error_type: Some("timeout"),
            operation: "chat",
            provider: "openai",
            model: Arc::from("m\"1"),
            token_type: None,
        };
        assert_eq!(
            key.label_text(),
            r#"error_type="timeout",gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="m\"1""#
        );
        assert_eq!(key.value("gen_ai_request_model").as_deref(), Some("m\"1"));
        assert_eq!(key.value("gen_ai_token_type"), None);
    }

    /// Every family's labels are sorted and are the attributes of the convention, named
    /// as Prometheus translates them; every family has an OpenTelemetry name and stands
    /// for a `tokentap_` family.
    #[test]
    fn the_families_are_the_conventions() {
        let mut names: Vec<&str> = family_names().collect();
        let sorted = {
            let mut n = names.clone();
            n.sort();
            n
        };
        assert_eq!(names, sorted, "the table is in name order");
        for family in &GEN_AI_FAMILIES {
            let mut labels = family.labels.to_vec();
            labels.sort();
            assert_eq!(labels, family.labels, "{}", family.name);
            for label in family.labels {
                assert!(otel_attribute(label).is_some(), "{label}");
            }
            let (otel, unit) = otel_name(family.name).expect("an OpenTelemetry name");
            let translated = otel.replace('.', "_")
                + match unit {
                    "s" => "_seconds",
                    _ => "",
                };
            assert_eq!(translated, family.name);
            assert!(REPLACED.iter().any(|(g, _)| *g == family.name));
        }
        names.dedup();
        assert_eq!(names.len(), GEN_AI_FAMILIES.len());
        assert!(MetricNames::GenAi.exposes("tokentap_inter_token_latency_seconds"));
        assert!(!MetricNames::GenAi.exposes("tokentap_time_to_first_token_seconds"));
        assert!(MetricNames::Both.exposes("tokentap_time_to_first_token_seconds"));
    }
}
