//! `limits.max_connections`: at the limit the proxy port stops accepting, so new clients
//! wait in the listen backlog (they are not accepted and closed) until a connection
//! closes, while the admin port keeps answering `/metrics`, `/healthz` and `/readyz`. By
//! default the limit follows the process's file descriptor limit, so a flood of idle
//! clients can no longer take every descriptor.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use tokentap_sim::SimConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

const MODELS: &[u8] = b"GET /v1/models HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";

/// How long a client past the limit is watched for an answer it must not get.
const NOT_SERVED_FOR: Duration = Duration::from_millis(500);

/// A bound on each admin exchange: without the fix a flood made them hang.
const ADMIN_ANSWERS_WITHIN: Duration = Duration::from_secs(10);

async fn admin_status(admin: SocketAddr, path: &str) -> StatusCode {
    let request = Request::get(format!("http://{admin}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    tokio::time::timeout(ADMIN_ANSWERS_WITHIN, client().request(request))
        .await
        .unwrap_or_else(|_| panic!("the admin port did not answer {path}"))
        .expect("admin request")
        .status()
}

/// `/readyz` turns 200 once the first probe reached the upstream.
async fn wait_ready(admin: SocketAddr) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while admin_status(admin, "/readyz").await != StatusCode::OK {
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn open_connections(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut open = Vec::with_capacity(count);
    for _ in 0..count {
        open.push(TcpStream::connect(addr).await.expect("connect"));
    }
    open
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_limit_a_new_client_waits_until_a_connection_closes() {
    let sim = SimHandle::start(SimConfig::default()).await;
    let proxy = Proxy::start(&sim.url(), "limits:\n  max_connections: 4\n").await;
    let mut idle = open_connections(proxy.addr, 4).await;
    proxy
        .wait_metrics(
            "4 open client connections and the accept loop at the limit",
            |m| {
                m.sum("tokentap_client_connections", &[]) == 4.0
                    && m.sum("tokentap_client_connection_limit_reached_total", &[]) >= 1.0
            },
        )
        .await;

    // A fifth client connects (the kernel's backlog takes it) and sends a request: while
    // the four stay open it gets no answer, and is not closed either.
    let mut fifth = TcpStream::connect(proxy.addr).await.expect("connect");
    fifth.write_all(MODELS).await.expect("send");
    let mut response = Vec::new();
    let early = tokio::time::timeout(NOT_SERVED_FOR, fifth.read_buf(&mut response)).await;
    assert!(
        early.is_err(),
        "a fifth connection was served or closed: {early:?} {:?}",
        String::from_utf8_lossy(&response)
    );

    // The admin port answers meanwhile, and counts the four.
    let m = tokio::time::timeout(ADMIN_ANSWERS_WITHIN, proxy.metrics())
        .await
        .expect("/metrics answers at the limit");
    assert_eq!(m.sum("tokentap_client_connections", &[]), 4.0, "{}", m.text);
    assert_eq!(
        m.sum("tokentap_client_connections_limit", &[]),
        4.0,
        "{}",
        m.text
    );
    assert_eq!(admin_status(proxy.admin, "/healthz").await, StatusCode::OK);
    wait_ready(proxy.admin).await;

    // One closes: the fifth is accepted and served.
    drop(idle.pop());
    tokio::time::timeout(Duration::from_secs(10), fifth.read_to_end(&mut response))
        .await
        .expect("the fifth is served once a connection closed")
        .expect("read");
    assert!(
        response.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&response)
    );
    // It asked to close: three idle ones are left.
    proxy
        .wait_metrics("the fifth connection closed", |m| {
            m.sum("tokentap_client_connections", &[]) == 3.0
        })
        .await;
}

/// The case that used to hang everything: more idle clients than the process has file
/// descriptors (`ulimit -n 128`, 150 clients). The default limit is what 128 descriptors
/// allow with 2 workers, (128 - 48 - 4 x 2 - 32) / 2 = 20, so tokentap never runs out of
/// descriptors: the admin port answers during the flood, `accept` never fails, and once
/// the clients leave a request is served. (The 130 clients past the limit fit in the
/// listen backlog, 1024 deep, so each one's connect completes at once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_clients_leaves_the_admin_port_and_later_clients_served() {
    let sim = SimHandle::start(SimConfig::default()).await;
    let process = TokentapProcess::start_with_yaml_and_fd_limit(
        "connection-flood",
        &format!("upstream: {}\n", sim.url()),
        128,
    );
    let listening = process.wait_log("proxy listening");
    assert_eq!(listening["max_connections"], 20, "{listening}");

    let flood = open_connections(process.proxy, 150).await;
    let m = tokio::time::timeout(
        Duration::from_secs(20),
        process.wait_metrics("the limit's worth of connections open", |m| {
            m.sum("tokentap_client_connections", &[]) == 20.0
        }),
    )
    .await
    .expect("/metrics answers during the flood");
    assert!(
        m.sum("tokentap_client_connection_limit_reached_total", &[]) >= 1.0,
        "{}",
        m.text
    );
    // The derived default is exported, for an alert to compare the open ones with.
    assert_eq!(
        m.sum("tokentap_client_connections_limit", &[]),
        20.0,
        "{}",
        m.text
    );
    assert_eq!(
        admin_status(process.admin, "/healthz").await,
        StatusCode::OK
    );
    wait_ready(process.admin).await;

    drop(flood);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let response = raw_exchange(process.proxy, MODELS).await;
        if response.starts_with(b"HTTP/1.1 200") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never served after the flood: {:?}",
            String::from_utf8_lossy(&response)
        );
    }
    process
        .wait_metrics("every client connection closed", |m| {
            m.sum("tokentap_client_connections", &[]) == 0.0
        })
        .await;
    let logs = process.all_logs();
    assert!(!logs.contains("accept failed"), "{logs}");
}

/// A configured limit above what the descriptors allow is lowered to that, with a
/// warning at start naming both numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_above_the_descriptor_limit_is_lowered_with_a_warning() {
    let sim = SimHandle::start(SimConfig::default()).await;
    let process = TokentapProcess::start_with_yaml_and_fd_limit(
        "connection-lowered",
        &format!(
            "upstream: {}\nlimits:\n  max_connections: 1000\n",
            sim.url()
        ),
        256,
    );
    let warning = process.wait_log("more than the file descriptor limit");
    assert_eq!(warning["level"], "WARN", "{warning}");
    assert_eq!(warning["configured"], 1000, "{warning}");
    assert_eq!(warning["allowed"], 84, "{warning}");
    assert_eq!(warning["nofile"], 256, "{warning}");
    let listening = process.wait_log("proxy listening");
    assert_eq!(listening["max_connections"], 84, "{listening}");
    // The limit in force is exported, not the configured one.
    process
        .wait_metrics("the lowered limit exported", |m| {
            m.sum("tokentap_client_connections_limit", &[]) == 84.0
        })
        .await;
}
