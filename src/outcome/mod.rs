//! How a request ended, in one place: the `outcome` and `status` labels of
//! `tokentap_requests_total`, and every rule that decides them.
//!
//! The vocabulary ([`Outcome`], [`StatusClass`], [`Verdict`]) and the verdict on a finished
//! request ([`verdict`]) are the metrics crate's (`tokentap_metrics::outcome`): they are what
//! the metrics are labelled with, and depend on nothing of the proxy. They are re-exported
//! here, so `crate::outcome::...` names them. What only the proxy can state stays here:
//!
//! - [`answer`]: what each failure before the response head answers and how it is counted
//!   (`ExchangeError::status`, `ExchangeError::outcome`), how a body's end is counted
//!   (`BodyEnd::outcome`), and the `grpc-status` a gRPC call gets for tokentap's answer:
//!   the transports' faults, mapped onto the vocabulary.
//!
//! The transports report what they saw (through the exchange policy) and the recorder
//! records; neither decides an outcome itself (docs/ARCHITECTURE.md, "Add an outcome
//! class").

pub mod answer;

pub use tokentap_metrics::outcome::*;
