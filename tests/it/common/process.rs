//! The real tokentap binary as a child process, for the tests that need signals, exit
//! codes, its own memory or its logs: started with `--log-format json`, its stderr
//! collected line by line, and its bound ports read from the startup logs (the configs
//! listen on port 0).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{scrape_metrics, vm_rss_bytes, wait_for_metrics, Metrics};

pub struct TokentapProcess {
    pub child: Child,
    /// Every stderr line so far (one JSON object each).
    pub logs: Arc<Mutex<Vec<String>>>,
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    /// A directory this process owns (its config), removed when it is dropped.
    dir: Option<PathBuf>,
}

impl TokentapProcess {
    /// Start `tokentap --config config_path` at log level `level`.
    pub fn start(config_path: &Path, level: &str) -> TokentapProcess {
        Self::spawn(config_path, level, None, None)
    }

    /// Start tokentap at log level `info` with `yaml` plus `listen` and `admin` on port 0,
    /// written to a temporary directory named after `name`.
    pub fn start_with_yaml(name: &str, yaml: &str) -> TokentapProcess {
        let path = Self::write_yaml(name, yaml);
        let dir = path.parent().map(Path::to_path_buf);
        Self::spawn(&path, "info", dir, None)
    }

    /// [`TokentapProcess::start_with_yaml`] with its soft file descriptor limit
    /// (`ulimit -Sn`) set to `nofile`, and 2 worker threads (`TOKIO_WORKER_THREADS`), so
    /// that what tokentap derives from the limit does not depend on the machine.
    pub fn start_with_yaml_and_fd_limit(name: &str, yaml: &str, nofile: u64) -> TokentapProcess {
        let path = Self::write_yaml(name, yaml);
        let dir = path.parent().map(Path::to_path_buf);
        Self::spawn(&path, "info", dir, Some(nofile))
    }

    fn write_yaml(name: &str, yaml: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tokentap-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokentap.yaml");
        std::fs::write(
            &path,
            format!("listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\n{yaml}"),
        )
        .unwrap();
        path
    }

    fn spawn(
        config_path: &Path,
        level: &str,
        dir: Option<PathBuf>,
        nofile: Option<u64>,
    ) -> TokentapProcess {
        let bin = env!("CARGO_BIN_EXE_tokentap");
        let mut command = match nofile {
            None => Command::new(bin),
            Some(nofile) => {
                // The shell lowers its own soft limit, then becomes tokentap (same pid).
                let mut command = Command::new("sh");
                command
                    .arg("-c")
                    .arg(format!("ulimit -Sn {nofile} && exec \"$0\" \"$@\""))
                    .arg(bin)
                    .env("TOKIO_WORKER_THREADS", "2");
                command
            }
        };
        let mut child = command
            .args([
                "--config",
                config_path.to_str().unwrap(),
                "--log-format",
                "json",
                // Tests run side by side: the live view on a free port, not its default.
                "--ui-listen",
                "127.0.0.1:0",
            ])
            .args(["--log-level", level])
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start tokentap");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let mut process = TokentapProcess {
            child,
            logs,
            proxy: "0.0.0.0:0".parse().unwrap(),
            admin: "0.0.0.0:0".parse().unwrap(),
            dir,
        };
        process.proxy = process.address("proxy listening", "listen");
        process.admin = process.address("admin listening", "addr");
        process
    }

    /// The first log line containing `needle`, waiting up to 20 s for it.
    pub fn wait_log(&self, needle: &str) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(line) = self
                .logs
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
            {
                return serde_json::from_str(line).expect("JSON log line");
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {needle:?}; logs:\n{}",
                self.all_logs()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn address(&self, message: &str, field: &str) -> SocketAddr {
        self.wait_log(message)[field]
            .as_str()
            .expect("address field")
            .parse()
            .unwrap()
    }

    pub fn all_logs(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    /// Send a signal (`"HUP"`, `"TERM"`) with `kill`.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    pub fn rss_bytes(&self) -> u64 {
        vm_rss_bytes(&self.child.id().to_string()).expect("VmRSS")
    }

    /// One scrape of the admin `/metrics`.
    pub async fn metrics(&self) -> Metrics {
        scrape_metrics(self.admin).await
    }

    /// Scrape until `condition` holds (10 s at most).
    pub async fn wait_metrics(&self, what: &str, condition: impl Fn(&Metrics) -> bool) -> Metrics {
        wait_for_metrics(self.admin, what, condition).await
    }

    /// Wait for the process to exit; returns its status and when it was seen to exit.
    pub async fn wait_exit(mut self, within: Duration) -> (ExitStatus, Instant) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let exited = Instant::now();
                // Let the log reader drain the pipe.
                tokio::time::sleep(Duration::from_millis(100)).await;
                return (status, exited);
            }
            assert!(
                Instant::now() < deadline,
                "tokentap did not exit within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for TokentapProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
