//! `tokentap inject`'s hostile input: AdmissionReview bodies and manifests
//! (fuzz/src/inject.rs).
#![no_main]

#[path = "../src/inject.rs"]
mod inject;

libfuzzer_sys::fuzz_target!(|data: &[u8]| inject::check_inject(data));
