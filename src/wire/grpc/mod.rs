//! The engines' gRPC streams: the generated message types ([`proto`]), the message
//! framing ([`framing`]) and the dialects' rules ([`smg`], [`triton`]).

pub mod framing;
pub mod proto;
pub(crate) mod smg;
pub(crate) mod triton;
