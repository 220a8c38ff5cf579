//! The engines' gRPC streams: the generated message types ([`proto`]).
pub mod proto;
