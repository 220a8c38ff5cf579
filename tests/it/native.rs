//! `/metrics` in the Prometheus protobuf format with native histograms: what a Prometheus
//! with native histograms enabled asks for. Streams of known shape go through tokentap
//! (a simulator with fixed TTFT, ITL and token count, no jitter); the protobuf scrape is
//! decoded with prost and compared with what the streams were and with the text scrape.

use crate::common;

use std::time::Duration;

use common::{client, Proxy, SimHandle};
use http_body_util::BodyExt;
use prost::Message;
use tokentap::metrics::native::upper_bound;
use tokentap::metrics::protobuf::{self, Histogram, MetricFamily, MetricType};
use tokentap_sim::{ModelProfile, SimConfig};

/// What Prometheus 2.x sends with `--enable-feature=native-histograms`.
const PROMETHEUS_ACCEPT: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";

const TTFT: Duration = Duration::from_millis(20);
const TOKENS: u32 = 10;
const REQUESTS: u32 = 3;

fn decode(mut body: &[u8]) -> Vec<MetricFamily> {
    let mut families = Vec::new();
    while !body.is_empty() {
        families.push(MetricFamily::decode_length_delimited(&mut body).expect("a family"));
    }
    families
}

/// `(bucket index, count)` of a histogram's positive native buckets.
fn native_buckets(h: &Histogram) -> Vec<(i32, u64)> {
    let (mut out, mut index, mut count) = (Vec::new(), 0i32, 0i64);
    let mut deltas = h.positive_delta.iter();
    for (n, span) in h.positive_span.iter().enumerate() {
        index = if n == 0 {
            span.offset()
        } else {
            index + span.offset()
        };
        for _ in 0..span.length() {
            count += deltas.next().expect("a delta per bucket");
            out.push((index, u64::try_from(count).expect("a count")));
            index += 1;
        }
    }
    out
}

/// The only series of a histogram family.
fn histogram<'f>(families: &'f [MetricFamily], name: &str) -> &'f Histogram {
    let family = families
        .iter()
        .find(|f| f.name() == name)
        .unwrap_or_else(|| panic!("{name} in the scrape"));
    assert_eq!(family.r#type(), MetricType::Histogram);
    assert_eq!(family.metric.len(), 1, "{name}: one label pair");
    family.metric[0].histogram.as_ref().expect("a histogram")
}

async fn proxied_streams(yaml: &str) -> (SimHandle, Proxy) {
    let sim = SimHandle::start(SimConfig {
        models: vec![ModelProfile::new(
            "native-model",
            TTFT,
            Duration::from_millis(2),
            TOKENS,
        )],
        ..SimConfig::default()
    })
    .await;
    let proxy = Proxy::start(&sim.url(), yaml).await;
    for _ in 0..REQUESTS {
        let request = common::chat(
            &proxy.url("/v1/chat/completions"),
            "native-model",
            "t",
            true,
            true,
        );
        let response = client().request(request).await.expect("response");
        response.into_body().collect().await.expect("stream");
    }
    proxy
        .wait_metrics("every request recorded", |m| {
            m.sum("tokentap_requests_total", &[]) == f64::from(REQUESTS)
        })
        .await;
    (sim, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protobuf_scrape_carries_native_and_classic_buckets() {
    let (_sim, proxy) = proxied_streams("").await;

    let (content_type, body) = proxy.scrape_as(Some(PROMETHEUS_ACCEPT)).await;
    assert_eq!(content_type, protobuf::CONTENT_TYPE);
    let families = decode(&body);
    let (text_type, text) = proxy.scrape_as(None).await;
    assert!(text_type.starts_with("text/plain"), "{text_type}");
    let text = common::Metrics::parse(&String::from_utf8_lossy(&text));

    let names: Vec<&str> = families.iter().map(|f| f.name()).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted, "families in name order");
    let requests = families
        .iter()
        .find(|f| f.name() == "tokentap_requests_total")
        .expect("requests");
    assert_eq!(
        requests.metric[0].counter.as_ref().map(|c| c.value()),
        Some(3.0)
    );

    // Every histogram: one count and sum for both kinds, equal to the text's, classic
    // buckets as the text has them, native buckets adding up to the count.
    for family in families
        .iter()
        .filter(|f| f.r#type() == MetricType::Histogram)
    {
        for metric in &family.metric {
            let labels: Vec<(&str, &str)> =
                metric.label.iter().map(|l| (l.name(), l.value())).collect();
            let h = metric.histogram.as_ref().expect("a histogram");
            let name = family.name();
            assert_eq!(
                h.sample_count() as f64,
                text.sum(&format!("{name}_count"), &labels)
            );
            assert_eq!(
                h.sample_sum(),
                text.sum(&format!("{name}_sum"), &labels),
                "{name}"
            );
            for bucket in &h.bucket {
                let le = bucket.upper_bound().to_string();
                let mut with_le = labels.clone();
                with_le.push(("le", &le));
                let text_count = text.sum(&format!("{name}_bucket"), &with_le);
                assert_eq!(
                    bucket.cumulative_count() as f64,
                    text_count,
                    "{name} le={le}"
                );
            }
            assert!(!h.bucket.is_empty(), "{name}: classic buckets by default");
            assert_eq!(h.schema, Some(3), "{name}: factor 1.1 is schema 3");
            let native_total: u64 = native_buckets(h).iter().map(|(_, n)| n).sum();
            assert_eq!(native_total + h.zero_count(), h.sample_count(), "{name}");
        }
    }

    // The known streams: three TTFTs, each at least the simulator's 20 ms (and far below
    // a second), and the tokens after the first of each stream as ITL observations.
    let ttft = histogram(&families, "tokentap_time_to_first_token_seconds");
    assert_eq!(ttft.sample_count(), u64::from(REQUESTS));
    assert_eq!(ttft.zero_count(), 0);
    for (index, _) in native_buckets(ttft) {
        assert!(
            upper_bound(index, 3) >= TTFT.as_secs_f64(),
            "bucket {index}"
        );
        assert!(upper_bound(index - 1, 3) < 1.0, "bucket {index}");
    }
    let itl = histogram(&families, "tokentap_inter_token_latency_seconds");
    assert_eq!(itl.sample_count(), u64::from(REQUESTS * (TOKENS - 1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_false_leaves_native_buckets_only() {
    let (_sim, proxy) =
        proxied_streams("metrics:\n  native_histograms:\n    schema: 0\n    classic: false\n")
            .await;
    let (_, body) = proxy.scrape_as(Some(protobuf::CONTENT_TYPE)).await;
    let families = decode(&body);
    let ttft = histogram(&families, "tokentap_time_to_first_token_seconds");
    assert!(ttft.bucket.is_empty());
    assert_eq!(ttft.schema, Some(0));
    let native_total: u64 = native_buckets(ttft).iter().map(|(_, n)| n).sum();
    assert_eq!(native_total + ttft.zero_count(), u64::from(REQUESTS));
}
