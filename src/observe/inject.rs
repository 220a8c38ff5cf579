//! Panics on request, for the tests of the exchange's panic boundary
//! ([`crate::exchange::boundary`]): a header names the stage of an exchange to panic at.
//! Declared only in test builds, so no release build can be made to panic this way.
//! (Here, below the exchange, because observation reads the response head too.)

/// Where a test makes an exchange panic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// While the request is sent upstream (named in a request header).
    Send,
    /// While the upstream's response head is read (named in a response header).
    Head,
    /// At the first piece of the response body (named in a response header).
    Body,
}

/// The header that names a [`Stage`] to panic at, in test builds only.
pub(crate) const INJECT: &str = "x-tokentap-test-panic";

/// Panic if `headers` ask for it at `stage` (test builds only).
pub(crate) fn injected_panic(headers: &http::HeaderMap, stage: Stage) {
    if asks(headers, stage) {
        panic!("injected panic at {stage:?}");
    }
}

/// Whether `headers` ask for a panic at `stage`.
pub(crate) fn asks(headers: &http::HeaderMap, stage: Stage) -> bool {
    headers.get(INJECT).is_some_and(|v| {
        v.as_bytes()
            .eq_ignore_ascii_case(format!("{stage:?}").as_bytes())
    })
}
