//! The fast path's entry on a plain HTTP/1.1 connection: tokentap reads the first request
//! head itself ([`request_head`]) and answers a head that `httparse` refuses with hyper's
//! own bytes; every other connection is handed to hyper with what was read
//! ([`Rewind`](super::rewind::Rewind)), so hyper serves it exactly as if it had read every
//! byte itself. Heads the fast path could forward are handed over too, until
//! the fast path relays requests itself (issue 15).

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::request_head::{self, Decision, HeadReader, HeadRules};
use crate::config::{Config, HostHeader};

/// How much is read from the connection at a time while its head is incomplete.
const READ_CHUNK: usize = 8192;

/// The request-head rules of one configuration, owned so that a connection can keep them.
#[derive(Debug, Clone)]
pub struct FirstHeadRules {
    max_header_bytes: usize,
    max_headers: usize,
    upstream_host: String,
    preserve_host: bool,
    base_path: String,
}

impl FirstHeadRules {
    pub fn new(config: &Config) -> FirstHeadRules {
        let authority = &config.upstream.authority;
        let upstream_host = match authority.port_u16() {
            Some(port) if port != 80 => format!("{}:{port}", authority.host()),
            _ => authority.host().to_string(),
        };
        FirstHeadRules {
            max_header_bytes: config.limits.max_header_bytes,
            max_headers: config.limits.max_headers,
            upstream_host,
            preserve_host: config.upstream.host_header == HostHeader::Preserve,
            base_path: config.upstream.base_path.clone(),
        }
    }

    fn rules(&self) -> HeadRules<'_> {
        HeadRules {
            max_header_bytes: self.max_header_bytes,
            max_headers: self.max_headers,
            upstream_host: self.upstream_host.as_bytes(),
            preserve_host: self.preserve_host,
            base_path: &self.base_path,
        }
    }
}

/// What became of a connection's first head.
#[derive(Debug)]
pub enum FirstHead {
    /// hyper serves the connection; these bytes were read from it already.
    HandOff(Vec<u8>),
    /// Nothing is left to serve: the head was answered (and the connection is to be
    /// closed), or the client closed before its head was complete.
    Done,
}

/// Read the first request head of `stream` and answer or hand it off. The caller bounds
/// the time this takes (`limits.header_read_timeout`) and stops it at shutdown.
pub async fn read(stream: &mut TcpStream, rules: &FirstHeadRules) -> io::Result<FirstHead> {
    let rules = rules.rules();
    let mut input = Vec::with_capacity(READ_CHUNK);
    let mut reader = HeadReader::new();
    loop {
        if input.capacity() - input.len() < READ_CHUNK / 2 {
            input.reserve(READ_CHUNK);
        }
        if stream.read_buf(&mut input).await? == 0 {
            return Ok(FirstHead::Done);
        }
        match reader.decide(&input, &rules) {
            Decision::NeedMore => {}
            Decision::Reject(status) => {
                stream.write_all(&request_head::rejection(status)).await?;
                stream.flush().await?;
                return Ok(FirstHead::Done);
            }
            Decision::Forward(_) | Decision::HandOff(_) => return Ok(FirstHead::HandOff(input)),
        }
    }
}
