//! `scrape`: time full `GET`s of a URL (the admin `/metrics`), median of repeats, in the
//! exposition format an `Accept` header asks for; reports the body size and the
//! `Content-Type` served, so a run can show which format it measured.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context};
use bytes::Bytes;
use http::{header, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use crate::cli::ScrapeArgs;
use crate::runtime;

pub(crate) fn scrape(args: &ScrapeArgs) -> anyhow::Result<()> {
    let uri: Uri = args.url.parse().context("--url")?;
    let authority = uri
        .authority()
        .context("--url needs host:port")?
        .to_string();
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let rt = runtime(1)?;
    rt.block_on(async move {
        let mut times = Vec::new();
        let mut bytes = 0usize;
        let mut served = String::new();
        for round in 0..=args.repeat {
            let stream = tokio::net::TcpStream::connect(&authority).await?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
                    .await?;
            tokio::spawn(conn);
            let mut request = Request::get(path.as_str()).header(header::HOST, authority.as_str());
            if let Some(accept) = &args.accept {
                request = request.header(header::ACCEPT, accept.as_str());
            }
            let request = request.body(Full::new(Bytes::new()))?;
            let t0 = Instant::now();
            let response = sender.send_request(request).await?;
            let status = response.status();
            let content_type = response
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            // Count the body as it streams: holding 130 MB here would time this client's
            // page faults, not the scrape.
            let mut body = response.into_body();
            let mut received = 0usize;
            while let Some(frame) = body.frame().await {
                if let Some(data) = frame?.data_ref() {
                    received += data.len();
                }
            }
            let took = t0.elapsed();
            if status != StatusCode::OK {
                bail!("{} answered {status}", args.url);
            }
            bytes = received;
            served = content_type;
            if round > 0 {
                times.push(took.as_secs_f64() * 1e3);
            }
        }
        times.sort_by(|a, b| a.total_cmp(b));
        let median = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
        let out = serde_json::json!({
            "url": args.url,
            "accept": args.accept,
            "content_type": served,
            "bytes": bytes,
            "median_ms": (median * 100.0).round() / 100.0,
            "min_ms": (times.first().copied().unwrap_or(f64::NAN) * 100.0).round() / 100.0,
            "max_ms": (times.last().copied().unwrap_or(f64::NAN) * 100.0).round() / 100.0,
        });
        println!("{out}");
        let _ = std::io::stdout().flush();
        Ok(())
    })
}
