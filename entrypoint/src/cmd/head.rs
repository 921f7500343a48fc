//! `argus-agent head [--json]`: read and show the discovery record.

use std::path::PathBuf;
use std::time::SystemTime;

use argus_discovery::read_record;

fn head_file() -> Result<PathBuf, String> {
    let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if let Some(f) = get("ARGUS_HEAD_IP_FILE") {
        return Ok(PathBuf::from(f));
    }
    let root = get("ARGUS_SHARED_ROOT").unwrap_or_else(|| "/private".into());
    let cluster = get("ARGUS_CLUSTER_NAME").unwrap_or_else(|| "argus-ray".into());
    if cluster.contains('/') {
        return Err(format!(
            "ARGUS_CLUSTER_NAME={cluster:?}: must not contain `/`"
        ));
    }
    Ok(PathBuf::from(root)
        .join("ray/discovery")
        .join(cluster)
        .join("head.json"))
}

/// Prints the record with its age; exit 1 when it cannot be read.
pub fn run(json: bool) -> u8 {
    let path = match head_file() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("argus-agent: configuration error: {e}");
            return 78;
        }
    };
    let (rec, _) = match read_record(&path) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("argus-agent: {e}");
            return 1;
        }
    };
    let age = rec.wall_age(SystemTime::now());
    if json {
        let mut v = serde_json::to_value(&rec).expect("record serialises");
        v["path"] = serde_json::json!(path.display().to_string());
        v["age_s"] = serde_json::json!(age);
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
        return 0;
    }
    println!("path:        {}", path.display());
    println!("state:       {:?}", rec.state);
    println!(
        "head:        {} (gcs), {} (jobs)",
        rec.gcs_address(),
        rec.job_server_url
    );
    println!("instance:    {}", rec.instance_id);
    println!(
        "generation:  {} seq {} holder {}",
        rec.generation, rec.seq, rec.holder_id
    );
    println!(
        "updated at:  {} (expires {})",
        rec.updated_at, rec.expires_at
    );
    if let Some(a) = age {
        println!(
            "age:         {a:.1}s by this machine's clock (TTL {}s)",
            rec.ttl_s
        );
    }
    0
}
