//! `argus-agent head [--json]`: read and show the discovery record.

use std::collections::BTreeMap;
use std::time::SystemTime;

use argus_config::{Discovery, Reader};
use argus_discovery::read_record;

use super::Outcome;

/// Prints the record with its age.
pub fn run(json: bool) -> Outcome {
    let d = Discovery::read(&mut Reader::new(&BTreeMap::new()))?;
    // Only a record the agent's writer identity wrote is shown (R-SEC-2).
    argus_discovery::trust::set_agent(d.agent_user);
    let path = d.head_file;
    let (rec, _) = read_record(&path)?;
    let age = rec.wall_age(SystemTime::now());
    if json {
        let mut v = serde_json::to_value(&rec)?;
        v["path"] = serde_json::json!(path.display().to_string());
        v["age_s"] = serde_json::json!(age);
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
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
    Ok(0)
}
