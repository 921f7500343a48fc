//! A pretend head for worker tests: publishes a record on the sandbox's
//! shared folder every 200 ms.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use argus_discovery::{publish, HeadRecord, HeadState, SCHEMA_VERSION};

use super::Sandbox;

/// A record of a running head at `ip:port`.
pub fn record(ip: &str, port: u16, instance: &str, generation: u64, seq: u64) -> HeadRecord {
    let now = SystemTime::now();
    HeadRecord {
        gcs_ft: false,
        schema_version: SCHEMA_VERSION,
        cluster_name: "argus-ray".into(),
        head_ip: ip.into(),
        gcs_port: port,
        dashboard_port: 8265,
        job_server_url: format!("http://{ip}:8265"),
        updated_at: argus_discovery::record::rfc3339(now),
        expires_at: argus_discovery::record::rfc3339(now + Duration::from_secs(3)),
        instance_id: instance.into(),
        holder_id: "test-head".into(),
        generation,
        seq,
        state: HeadState::Running,
        ttl_s: 3.0,
    }
}

/// A pretend head refreshing the record every 200 ms until told otherwise.
pub struct FakeHead {
    current: Arc<Mutex<Option<HeadRecord>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeHead {
    pub fn start(sb: &Sandbox, rec: HeadRecord) -> Self {
        sb.write_cluster_token();
        let current = Arc::new(Mutex::new(Some(rec)));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s, path) = (current.clone(), stop.clone(), sb.head_file());
        let thread = std::thread::spawn(move || {
            let mut seq = 0;
            while !s.load(Ordering::Relaxed) {
                if let Some(mut r) = c.lock().unwrap().clone() {
                    seq += 1;
                    r.seq = seq;
                    publish(&path, &r.to_bytes()).unwrap();
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        Self {
            current,
            stop,
            thread: Some(thread),
        }
    }

    /// Replaces what is published (None pauses refreshing: a stale record).
    pub fn set(&self, rec: Option<HeadRecord>) {
        *self.current.lock().unwrap() = rec;
    }
}

impl Drop for FakeHead {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
