//! The head record (R-HEAD-3) and its validation.

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

/// The record layout this code writes and reads.
pub const SCHEMA_VERSION: u32 = 1;

/// Readers refuse files larger than this (a record is a few hundred bytes).
pub const MAX_RECORD_BYTES: usize = 64 * 1024;

/// Whether the head is serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HeadState {
    Running,
    Stopped,
}

/// What the head publishes. Unknown fields are ignored on read so that
/// newer heads can add fields without breaking older workers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeadRecord {
    pub schema_version: u32,
    pub cluster_name: String,
    pub head_ip: String,
    pub gcs_port: u16,
    pub dashboard_port: u16,
    pub job_server_url: String,
    /// RFC 3339 UTC, head's clock; diagnostic only.
    pub updated_at: String,
    /// RFC 3339 UTC, head's clock; diagnostic only (R-WRK-5).
    pub expires_at: String,
    /// Changes every time the head (re)starts Ray.
    pub instance_id: String,
    /// Which agent holds the generation (hostname, pid, random).
    pub holder_id: String,
    /// Fencing token: grows when another head takes over.
    pub generation: u64,
    /// Grows with every refresh, so every refresh changes the bytes.
    pub seq: u64,
    pub state: HeadState,
    /// The lease duration the head was configured with, in seconds.
    pub ttl_s: f64,
    /// The head's GCS keeps its state in an external Redis (R-WRK-7):
    /// workers ride a restart at the same address through. Absent in
    /// records of older heads: false.
    #[serde(default)]
    pub gcs_ft: bool,
}

/// Why bytes are not a valid head record.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("empty file")]
    Empty,
    #[error("{size} bytes exceeds the limit of {MAX_RECORD_BYTES}")]
    TooLarge { size: usize },
    #[error("not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("not a JSON object")]
    NotObject,
    #[error("missing or non-integer schema_version")]
    NoSchema,
    #[error("schema_version {found} is not supported (this agent reads {SCHEMA_VERSION})")]
    Schema { found: u64 },
    #[error("bad field: {0}")]
    Shape(#[source] serde_json::Error),
    #[error("field {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

fn invalid(field: &'static str, reason: impl Into<String>) -> RecordError {
    RecordError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// Formats a wall-clock time as RFC 3339 UTC with seconds.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

impl HeadRecord {
    /// Parses and validates `bytes`. Never panics, whatever the input.
    pub fn parse(bytes: &[u8]) -> Result<Self, RecordError> {
        if bytes.len() > MAX_RECORD_BYTES {
            return Err(RecordError::TooLarge { size: bytes.len() });
        }
        if bytes.iter().all(|b| b.is_ascii_whitespace()) {
            return Err(RecordError::Empty);
        }
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(RecordError::NotJson)?;
        let obj = value.as_object().ok_or(RecordError::NotObject)?;
        let schema = obj
            .get("schema_version")
            .and_then(|v| v.as_u64())
            .ok_or(RecordError::NoSchema)?;
        if schema != u64::from(SCHEMA_VERSION) {
            return Err(RecordError::Schema { found: schema });
        }
        let rec: HeadRecord = serde_json::from_value(value).map_err(RecordError::Shape)?;
        rec.validate()?;
        Ok(rec)
    }

    /// Serialises the record (one line of JSON plus a newline).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("a record always serialises");
        v.push(b'\n');
        v
    }

    /// Checks that every field is sane.
    pub fn validate(&self) -> Result<(), RecordError> {
        let name_ok = !self.cluster_name.is_empty()
            && self.cluster_name.len() <= 63
            && self
                .cluster_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !name_ok {
            return Err(invalid("cluster_name", "must be 1-63 of [A-Za-z0-9._-]"));
        }
        let ip: IpAddr = self.head_ip.parse().map_err(|_| {
            invalid(
                "head_ip",
                format!("`{}` is not an IP address", self.head_ip),
            )
        })?;
        if ip.is_unspecified() || ip.is_multicast() {
            return Err(invalid("head_ip", "must be a unicast address"));
        }
        if self.gcs_port == 0 {
            return Err(invalid("gcs_port", "must be 1-65535"));
        }
        if self.dashboard_port == 0 {
            return Err(invalid("dashboard_port", "must be 1-65535"));
        }
        if self.job_server_url.len() > 512 {
            return Err(invalid("job_server_url", "longer than 512 bytes"));
        }
        let updated = humantime::parse_rfc3339(&self.updated_at)
            .map_err(|e| invalid("updated_at", format!("not RFC 3339 UTC: {e}")))?;
        let expires = humantime::parse_rfc3339(&self.expires_at)
            .map_err(|e| invalid("expires_at", format!("not RFC 3339 UTC: {e}")))?;
        if expires < updated {
            return Err(invalid("expires_at", "is before updated_at"));
        }
        let id_ok = |s: &str| !s.is_empty() && s.len() <= 256 && !s.chars().any(char::is_control);
        if !id_ok(&self.instance_id) {
            return Err(invalid("instance_id", "must be 1-256 printable characters"));
        }
        if !id_ok(&self.holder_id) {
            return Err(invalid("holder_id", "must be 1-256 printable characters"));
        }
        if self.generation == 0 {
            return Err(invalid("generation", "must be at least 1"));
        }
        if self.generation > crate::claim::MAX_GENERATION {
            return Err(invalid(
                "generation",
                format!("must be at most {}", crate::claim::MAX_GENERATION),
            ));
        }
        if !(self.ttl_s.is_finite() && self.ttl_s > 0.0 && self.ttl_s <= 86_400.0) {
            return Err(invalid(
                "ttl_s",
                "must be a positive number of seconds up to a day",
            ));
        }
        Ok(())
    }

    /// Returns `ip:port` of the GCS, bracketing IPv6.
    pub fn gcs_address(&self) -> String {
        match self.head_ip.parse::<IpAddr>() {
            Ok(IpAddr::V6(_)) => format!("[{}]:{}", self.head_ip, self.gcs_port),
            _ => format!("{}:{}", self.head_ip, self.gcs_port),
        }
    }

    /// Returns the lease duration the head announced.
    pub fn ttl(&self) -> Duration {
        Duration::from_secs_f64(self.ttl_s)
    }

    /// Returns how far the head's `updated_at` is from `now` on this
    /// machine's clock (positive: the record looks old), for diagnostics.
    pub fn wall_age(&self, now: SystemTime) -> Option<f64> {
        let updated = humantime::parse_rfc3339(&self.updated_at).ok()?;
        Some(match now.duration_since(updated) {
            Ok(d) => d.as_secs_f64(),
            Err(e) => -e.duration().as_secs_f64(),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub fn sample() -> HeadRecord {
        HeadRecord {
            gcs_ft: false,
            schema_version: SCHEMA_VERSION,
            cluster_name: "argus-ray".into(),
            head_ip: "10.0.0.5".into(),
            gcs_port: 6379,
            dashboard_port: 8265,
            job_server_url: "http://10.0.0.5:8265".into(),
            updated_at: "2026-11-22T00:00:00Z".into(),
            expires_at: "2026-11-22T00:01:00Z".into(),
            instance_id: "4b1c".into(),
            holder_id: "head-a/42/x".into(),
            generation: 1,
            seq: 7,
            state: HeadState::Running,
            ttl_s: 60.0,
        }
    }

    #[test]
    fn record_round_trips() {
        let r = sample();
        let bytes = r.to_bytes();
        assert_eq!(HeadRecord::parse(&bytes).unwrap(), r);
        assert_eq!(r.gcs_address(), "10.0.0.5:6379");
        let mut v6 = sample();
        v6.head_ip = "fd00::1".into();
        assert_eq!(v6.gcs_address(), "[fd00::1]:6379");
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let mut v = serde_json::to_value(sample()).unwrap();
        v["future_field"] = serde_json::json!({"a": [1, 2]});
        let bytes = serde_json::to_vec(&v).unwrap();
        assert_eq!(HeadRecord::parse(&bytes).unwrap(), sample());
    }

    fn with(field: &str, value: serde_json::Value) -> Vec<u8> {
        let mut v = serde_json::to_value(sample()).unwrap();
        if value.is_null() {
            v.as_object_mut().unwrap().remove(field);
        } else {
            v[field] = value;
        }
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn every_malformed_shape_is_a_typed_error() {
        use serde_json::json;
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"".to_vec(), "Empty"),
            (b"  \n".to_vec(), "Empty"),
            (vec![b' '; MAX_RECORD_BYTES + 1], "TooLarge"),
            (b"{\"schema_version\": 1, \"cluster".to_vec(), "NotJson"),
            (b"\xff\xfe".to_vec(), "NotJson"),
            (b"[1,2]".to_vec(), "NotObject"),
            (b"\"head\"".to_vec(), "NotObject"),
            (with("schema_version", serde_json::Value::Null), "NoSchema"),
            (with("schema_version", json!("1")), "NoSchema"),
            (with("schema_version", json!(2)), "Schema"),
            (with("head_ip", serde_json::Value::Null), "Shape"),
            (with("gcs_port", json!(70000)), "Shape"),
            (with("gcs_port", json!(-1)), "Shape"),
            (with("state", json!("paused")), "Shape"),
            (with("seq", json!("x")), "Shape"),
            (with("head_ip", json!("not-an-ip")), "Invalid"),
            (with("head_ip", json!("0.0.0.0")), "Invalid"),
            (with("gcs_port", json!(0)), "Invalid"),
            (with("dashboard_port", json!(0)), "Invalid"),
            (with("cluster_name", json!("")), "Invalid"),
            (with("cluster_name", json!("../x")), "Invalid"),
            (with("updated_at", json!("yesterday")), "Invalid"),
            (with("expires_at", json!("2026-11-21T00:00:00Z")), "Invalid"),
            (with("instance_id", json!("")), "Invalid"),
            (with("holder_id", json!("a\nb")), "Invalid"),
            (with("generation", json!(0)), "Invalid"),
            (with("generation", json!(u64::MAX)), "Invalid"),
            (with("generation", json!(999_999_999_999_999u64)), "Invalid"),
            (with("ttl_s", json!(0)), "Invalid"),
            (with("ttl_s", json!(-5)), "Invalid"),
        ];
        for (bytes, kind) in cases {
            let e = HeadRecord::parse(&bytes).expect_err(kind);
            let got = format!("{e:?}");
            assert!(got.starts_with(kind), "expected {kind}, got {got}");
            assert!(!e.to_string().contains('\n'));
        }
    }

    proptest! {
        #[test]
        fn parse_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = HeadRecord::parse(&bytes);
        }

        #[test]
        fn parse_never_panics_on_mutated_records(pos in 0usize..400, byte in any::<u8>(), cut in 0usize..400) {
            let mut bytes = sample().to_bytes();
            let n = bytes.len();
            bytes[pos % n] = byte;
            bytes.truncate(cut.max(1).min(n));
            let _ = HeadRecord::parse(&bytes);
        }

        #[test]
        fn parse_never_panics_on_arbitrary_json(s in "\\{(\"[a-z_]{1,16}\": ?(-?[0-9]{1,25}|\"[^\"]{0,20}\"|null|true|\\[\\]), ?){0,16}\"schema_version\": ?1\\}") {
            let _ = HeadRecord::parse(s.as_bytes());
        }
    }
}
