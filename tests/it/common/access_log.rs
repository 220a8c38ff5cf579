//! tokentap's access-log lines (`tokentap::access` events), captured in-process so tests
//! can check the line each request leaves, as issue 16 asks, beside the metrics delta.
//!
//! One global subscriber for the whole test binary (tokentap's worker threads are its
//! own, so a thread-local subscriber would miss them) keeps every access event's fields.
//! Tests run in parallel against their own proxies, so a test finds its lines by a label
//! value only it uses (a unique tenant or model). The server's warnings are kept too, so
//! a test can check that what the log claims (say, at the drain deadline) is true.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, Once};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

const ACCESS: &str = "tokentap::access";
const SERVER: &str = "tokentap::server";

/// One log line: its target, its message (`request`, `passthrough` for access lines) and
/// its fields, each as text (`Display` for the `%` fields, numbers and strings as written).
#[derive(Clone, Debug)]
pub struct LogLine {
    pub target: String,
    pub message: String,
    pub fields: BTreeMap<String, String>,
}

impl LogLine {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

static LINES: Mutex<Vec<LogLine>> = Mutex::new(Vec::new());
static INSTALL: Once = Once::new();

/// Start capturing (once per test binary; later calls do nothing).
pub fn install() {
    INSTALL.call_once(|| {
        let targets = Targets::new()
            .with_target(ACCESS, Level::INFO)
            .with_target(SERVER, Level::WARN);
        let layer = Collector.with_filter(targets);
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in the test binary");
    });
}

/// The access lines so far whose `field` is `value`.
pub fn lines_where(field: &str, value: &str) -> Vec<LogLine> {
    LINES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .iter()
        .filter(|line| line.target == ACCESS && line.field(field) == Some(value))
        .cloned()
        .collect()
}

/// The server's warnings so far whose message starts with `prefix`.
pub fn server_warnings(prefix: &str) -> Vec<LogLine> {
    LINES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .iter()
        .filter(|line| line.target.starts_with(SERVER) && line.message.starts_with(prefix))
        .cloned()
        .collect()
}

/// Wait until at least `count` access lines have `field` = `value` (panics after 10 s),
/// and return them all. A line is written when its request is recorded, which may come a
/// moment after the metrics show it.
pub async fn wait_for_lines(field: &str, value: &str, count: usize) -> Vec<LogLine> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let lines = lines_where(field, value);
        if lines.len() >= count {
            return lines;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {count} access lines with {field}={value}; got {lines:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The one access line of the request whose `field` is `value`: waits for it, checks
/// there is exactly one (a request logged twice fails here), and that it is a `request`
/// line with `outcome` and `status` (`None`: no status logged, no response head came).
pub async fn assert_one_request_line(
    field: &str,
    value: &str,
    outcome: &str,
    status: Option<u16>,
) -> LogLine {
    let mut lines = wait_for_lines(field, value, 1).await;
    assert_eq!(
        lines.len(),
        1,
        "{field}={value}: logged more than once: {lines:?}"
    );
    let line = lines.remove(0);
    assert_eq!(line.message, "request", "{line:?}");
    assert_eq!(
        line.field("outcome"),
        Some(outcome),
        "{field}={value}: {line:?}"
    );
    let logged_status = status.map(|s| s.to_string());
    assert_eq!(
        line.field("status"),
        logged_status.as_deref(),
        "{field}={value}: {line:?}"
    );
    line
}

/// Keeps each event it is given (the filter lets through access lines and server
/// warnings).
struct Collector;

impl<S: Subscriber> Layer<S> for Collector {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut line = LogLine {
            target: event.metadata().target().to_string(),
            message: String::new(),
            fields: BTreeMap::new(),
        };
        event.record(&mut line);
        LINES
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(line);
    }
}

impl Visit for LogLine {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.keep(field, value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.keep(field, format!("{value:?}"));
    }
}

impl LogLine {
    fn keep(&mut self, field: &Field, value: String) {
        if field.name() == "message" {
            self.message = value;
        } else {
            self.fields.insert(field.name().to_string(), value);
        }
    }
}
