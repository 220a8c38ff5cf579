//! tokentap's access-log lines (`tokentap::access` events), captured in-process so tests
//! can check the line each request leaves, as issue 16 asks, beside the metrics delta.
//!
//! One global subscriber for the whole test binary (tokentap's worker threads are its
//! own, so a thread-local subscriber would miss them) keeps every access event's fields.
//! Tests run in parallel against their own proxies, so a test finds its lines by a label
//! value only it uses (a unique tenant or model).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, Once};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

const TARGET: &str = "tokentap::access";

/// One access-log line: its message (`request`, `passthrough`) and its fields, each as
/// text (`Display` for the `%` fields, numbers and strings as written).
#[derive(Clone, Debug)]
pub struct AccessLine {
    pub message: String,
    pub fields: BTreeMap<String, String>,
}

impl AccessLine {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

static LINES: Mutex<Vec<AccessLine>> = Mutex::new(Vec::new());
static INSTALL: Once = Once::new();

/// Start capturing (once per test binary; later calls do nothing).
pub fn install() {
    INSTALL.call_once(|| {
        let layer = Collector.with_filter(Targets::new().with_target(TARGET, Level::INFO));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in the test binary");
    });
}

/// The access lines so far whose `field` is `value`.
pub fn lines_where(field: &str, value: &str) -> Vec<AccessLine> {
    LINES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .iter()
        .filter(|line| line.field(field) == Some(value))
        .cloned()
        .collect()
}

/// Wait until at least `count` access lines have `field` = `value` (panics after 10 s),
/// and return them all. A line is written when its request is recorded, which may come a
/// moment after the metrics show it.
pub async fn wait_for_lines(field: &str, value: &str, count: usize) -> Vec<AccessLine> {
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
) -> AccessLine {
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

/// Keeps each `tokentap::access` event it is given.
struct Collector;

impl<S: Subscriber> Layer<S> for Collector {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut line = AccessLine {
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

impl Visit for AccessLine {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.keep(field, value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.keep(field, format!("{value:?}"));
    }
}

impl AccessLine {
    fn keep(&mut self, field: &Field, value: String) {
        if field.name() == "message" {
            self.message = value;
        } else {
            self.fields.insert(field.name().to_string(), value);
        }
    }
}
