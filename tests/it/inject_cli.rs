//! `tokentap inject` as the binary runs it: with the `inject` feature it writes a
//! fixture's expected output (crates/inject has the full fixture set); without it, it
//! says how to get it and exits 2.

use std::io::Write;
use std::process::{Command, Stdio};

fn inject(args: &[&str], stdin: &[u8]) -> (Option<i32>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tokentap"))
        .arg("inject")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Built without the feature, the binary exits before it reads: a closed pipe is its
    // answer, not the test's failure.
    match child.stdin.take().unwrap().write_all(stdin) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        written => written.unwrap(),
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn inject_from_stdin_or_says_how_to_get_it() {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/crates/inject/tests/fixtures");
    let input = std::fs::read(format!("{fixtures}/vllm.yaml")).unwrap();
    let (code, out, err) = inject(&["-"], &input);
    if cfg!(feature = "inject") {
        assert_eq!(code, Some(0), "{err}");
        let want = std::fs::read_to_string(format!("{fixtures}/vllm.out.yaml")).unwrap();
        assert_eq!(out, want);
        let (code, out, err) = inject(&["--uninject"], out.as_bytes());
        assert_eq!(code, Some(0), "{err}");
        assert!(!out.contains("tokentap"), "{out}");
        let refused = std::fs::read(format!("{fixtures}/two-ports.yaml")).unwrap();
        let (code, out, err) = inject(&[], &refused);
        assert_eq!(code, Some(2));
        assert!(out.is_empty());
        assert!(err.contains("Deployment two-ports"), "{err}");
    } else {
        assert_eq!(code, Some(2));
        assert!(out.is_empty());
        assert!(err.contains("--features inject"), "{err}");
    }
}
