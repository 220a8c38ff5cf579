//! The server's background tasks, with one owner: [`Background`] starts them in order and
//! stops them in the order they must stop (declared once, as a list), so adding one is its
//! start and its place in that list.
//!
//! They run on the caller's runtime (the binary's control runtime), beside the accept loop:
//! the live view's ticker (`live_ticker`), the admin port's and the live view's listeners,
//! the span exporter (`otlp_spans`), the OTLP metrics push (`otlp_metrics`) and the upstream
//! probe (`upstream_probe`). The named ones run under the [`Supervisor`], which restarts one
//! that panics. `Server::run` stops them after the drain and after the workers, so the last
//! exports carry the final counts.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::admin::{self, Readiness};
use crate::config::Config;
use crate::live::Live;
use crate::metrics::Metrics;
use crate::otlp::exporter::Exporter;
use crate::otlp::span_mapping::Server as SpanServer;
use crate::otlp::spans::SpanExporter;
use crate::otlp::transport::Transport;
use crate::proxy::Proxy;
use crate::summary::Sinks;
use crate::supervise::Supervisor;

/// What the background tasks are started from.
pub(super) struct Start<'a> {
    pub config: &'a Config,
    pub metrics: &'a Arc<Metrics>,
    pub readiness: &'a Arc<Readiness>,
    pub proxy: &'a Arc<Proxy>,
    pub supervisor: &'a Supervisor,
    pub admin_listener: TcpListener,
    /// The live view's, while `ui.enabled`.
    pub ui_listener: Option<TcpListener>,
    /// The OTLP push's and the span export's connections, when on.
    pub otlp_transports: (Option<Transport>, Option<Transport>),
}

/// The running background tasks, held in the order they stop.
pub(super) struct Background {
    /// First to last.
    stopping: Vec<Box<dyn Stop>>,
}

impl Background {
    /// Start every background task, in this order: the live view (its ring fills from the
    /// start, so a viewer sees the last minutes), the admin port, the live view's
    /// listener, the span exporter, the OTLP metrics push, the upstream probe.
    pub fn start(start: Start<'_>) -> Background {
        let Start {
            config,
            metrics,
            readiness,
            proxy,
            supervisor,
            admin_listener,
            ui_listener,
            otlp_transports: (metrics_transport, traces_transport),
        } = start;
        let sinks = proxy.gateway().sinks();
        let live = config.ui.then(|| Live::start(sinks.clone(), supervisor));
        let live_at = ui_listener.as_ref().and_then(|l| l.local_addr().ok());
        let admin = tokio::spawn(admin::serve(
            admin_listener,
            metrics.clone(),
            readiness.clone(),
            live_at,
        ));
        let ui = ui_listener
            .zip(live.clone())
            .map(|(listener, live)| tokio::spawn(admin::serve_live(listener, live)));
        let spans = traces_transport
            .and_then(|transport| start_spans(config, transport, sinks, supervisor));
        let otlp = config
            .otlp
            .clone()
            .zip(metrics_transport)
            .map(|(settings, transport)| {
                Exporter::spawn(
                    settings,
                    transport,
                    metrics.clone(),
                    SystemTime::now(),
                    supervisor,
                )
            });
        let probe = {
            let (proxy, readiness, metrics) = (proxy.clone(), readiness.clone(), metrics.clone());
            supervisor.spawn("upstream_probe", move || {
                probe_upstream(proxy.clone(), readiness.clone(), metrics.clone())
            })
        };
        // The order they stop in. Spans first: their last batch goes out before the
        // metrics push's last export. The admin port answers scrapes, and the live view
        // serves, until those exports are done.
        let stopping: Vec<Box<dyn Stop>> = vec![
            Box::new(spans),
            Box::new(otlp),
            Box::new(probe),
            Box::new(admin),
            Box::new(ui),
            Box::new(live),
        ];
        Background { stopping }
    }

    /// Stop every task, one after the other, in the declared order.
    pub async fn stop(self) {
        for task in self.stopping {
            task.stop().await;
        }
    }
}

/// Start the span export (`otlp.traces`), naming the upstream as the spans' server.
fn start_spans(
    config: &Config,
    transport: Transport,
    sinks: &Arc<Sinks>,
    supervisor: &Supervisor,
) -> Option<SpanExporter> {
    let otlp = config.otlp.as_ref()?;
    let traces = otlp.traces.clone()?;
    let upstream = &config.upstream;
    let server = SpanServer {
        address: upstream.authority.host().to_string(),
        port: upstream.authority.port_u16().unwrap_or(
            if upstream.scheme == http::uri::Scheme::HTTPS {
                443
            } else {
                80
            },
        ),
    };
    Some(SpanExporter::spawn(
        traces,
        transport,
        otlp.resource.clone(),
        Some(server),
        sinks.clone(),
        supervisor,
    ))
}

/// How a running background task stops.
trait Stop: Send {
    fn stop(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// A listener's task or the probe: aborted.
impl Stop for JoinHandle<()> {
    fn stop(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.abort();
        Box::pin(std::future::ready(()))
    }
}

/// Sends what is queued, then stops.
impl Stop for SpanExporter {
    fn stop(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(self.finish())
    }
}

/// Makes its last export, then stops.
impl Stop for Exporter {
    fn stop(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(self.finish())
    }
}

/// Its ticker and tap; its subscriptions end.
impl Stop for Arc<Live> {
    fn stop(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Live::stop(&self);
        Box::pin(std::future::ready(()))
    }
}

/// A task that is off: nothing to stop.
impl<T: Stop> Stop for Option<T> {
    fn stop(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        match *self {
            Some(task) => Box::new(task).stop(),
            None => Box::pin(std::future::ready(())),
        }
    }
}

/// Keep `upstream_reachable` and `tokentap_upstream_up` current.
async fn probe_upstream(proxy: Arc<Proxy>, readiness: Arc<Readiness>, metrics: Arc<Metrics>) {
    let mut was = None;
    loop {
        // The upstream may change on reload: probe the one in force.
        let active = proxy.active();
        let interval = active.config.upstream.probe_interval;
        let reachable = active.upstream.probe().await;
        readiness
            .upstream_reachable
            .store(reachable, Ordering::Relaxed);
        metrics.upstream_up.set(i64::from(reachable));
        if was != Some(reachable) {
            if reachable {
                tracing::info!("upstream reachable");
            } else {
                tracing::warn!("upstream not reachable");
            }
            was = Some(reachable);
        }
        tokio::time::sleep(interval).await;
    }
}
