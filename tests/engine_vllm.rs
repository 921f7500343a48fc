//! Two real vLLM endpoints on the compose cluster, through the lb, checked
//! against a reference decode; one upgraded while clients call both.
//!
//! What a user does (docs/serve.md, "A real vLLM endpoint"): build the CPU
//! engine images of two vLLM versions (`scripts/build-images.sh engine
//! --local-base --cpu`, cached by their inputs' hash), bring up the cluster
//! and its `lb`, put a model in the model cache, `serve deploy`
//! docker/serve/llm-endpoints.yaml (endpoint A on vLLM 0.12.0 at /a,
//! endpoint B on vLLM 0.13.0 at /b) as the Ray user in the head, and call
//! `http://lb:8000/{a,b}/v1` with the official `openai` Python client.
//!
//! The model is a tiny random-weight Llama with a tokenizer trained on the
//! spot (tests/fixtures/tiny_llama.py, run in the engine image: it has torch
//! and transformers), written into the cluster's model cache; the engines
//! read it through the read-only bind of the config's run_options. The
//! oracle is transformers' greedy decode of the same weights and prompts.
//! For each endpoint, through the lb:
//!   - greedy chat and completion equal the reference token for token (ids,
//!     via vLLM's `return_tokens_as_token_ids`) and in text; streaming
//!     (server-sent events) yields the same text; `/v1/models` names the
//!     model; the `x-argus-engine` header names the image that answered;
//!   - an unknown model, a prompt over the context length and malformed
//!     JSON get OpenAI-style error bodies with a 4xx, and the endpoint
//!     answers afterwards; no replica is lost (serve status).
//!
//! Then the upgrade: clients POST chat completions to both endpoints in a
//! loop (tests/fixtures/openai_load.py, no retries) while A is moved to vLLM
//! 0.13.0 by a new `serve deploy` of the same file with A's image and module
//! changed. Neither endpoint may lose a request; A must answer from the new
//! image afterwards (its header), and its old engine container must be
//! gone. The node image's Serve rolls the upgrade start-first (the new
//! replica runs before the old one stops; Ray 2.53 alone stops first and A
//! then answers nothing for a whole cold start, 48 s here): no call to A
//! may wait more than twice its steady p99 or B's longest wait meanwhile.
//!
//! Last, the drain: clients stream chat completions (96 tokens each) from
//! both endpoints while the worker that runs A's engine is stopped with
//! `docker stop` and started again. Its agent drains first; every streamed
//! answer must come whole (finish_reason "length", every token), none may
//! fail, and some must have been in flight at the stop.
//!
//! Then embeddings: the same model deployed as a pooling model (`runner:
//! pooling`, last-token pooling, normalised) on both versions, replacing A
//! and B; `/v1/embeddings` through the lb with the official client must
//! equal transformers' embedding of the same weights (cosine at least
//! 0.9999, the same prompt tokens) and name the image that answered.
//!
//! The clients run in a container of engine image B on the compose network
//! (the image pins `openai`). Each phase's wall time is printed. Docker
//! missing is a FAILURE, never a skip. ARGUS_E2E_KEEP=1 leaves the cluster.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

#[path = "support/compose.rs"]
mod compose;

use compose::{
    build_cpu_engine_image, build_images, build_lb_image, free_port, inspect, log, output,
    require_docker, run, with_stdin, workspace_root, Cluster,
};
use serde_json::{json, Value};

/// Endpoint A's vLLM before and after the upgrade; B's all along.
const OLD: &str = "0.12.0";
const NEW: &str = "0.13.0";
const MODEL: &str = "tiny-llama";
/// Tokens per greedy answer.
const MAX_TOKENS: u64 = 16;
/// Longest wait for the endpoints to come up: two CPU engines starting side
/// by side on a loaded 2-core box.
const DEPLOY_TIMEOUT: Duration = Duration::from_secs(1500);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn docker() -> Command {
    Command::new("docker")
}

/// Times one phase and prints it.
fn phase<T>(name: &str, f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let v = f();
    let took = start.elapsed();
    log(&format!("phase {name}: {:.1} s", took.as_secs_f64()));
    (v, took)
}

/// The serve module of a vLLM version: "0.12.0" -> "v0_12_0".
fn module(vllm: &str) -> String {
    format!("v{}", vllm.replace('.', "_"))
}

/// The `x-argus-engine` header of a CPU engine image of `vllm`.
fn engine_header(vllm: &str) -> String {
    format!("vllm/v{vllm}-cpu")
}

/// The chat and completion cases, each answered greedily with MAX_TOKENS.
fn cases() -> Value {
    json!([
        {"messages": [{"role": "user", "content": "hello world"}], "max_tokens": MAX_TOKENS},
        {"messages": [
            {"role": "system", "content": "the cluster serves models"},
            {"role": "user", "content": "the quick brown fox"}
        ], "max_tokens": MAX_TOKENS},
        {"prompt": "hello world", "max_tokens": MAX_TOKENS},
        {"prompt": "ray serve vllm chat completion", "max_tokens": MAX_TOKENS}
    ])
}

/// docker/serve/llm-endpoints.yaml with its placeholders filled: endpoint A
/// on vLLM `a`, B on `b`, this cluster's model cache.
fn endpoints_config(c: &Cluster, a: &str, b: &str) -> String {
    let p = workspace_root().join("docker/serve/llm-endpoints.yaml");
    let t = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let out = t
        .replace("${ENGINE_IMAGE_A}", &compose::cpu_engine_image(a))
        .replace("${ENGINE_MODULE_A}", &module(a))
        .replace("${ENGINE_IMAGE_B}", &compose::cpu_engine_image(b))
        .replace("${ENGINE_MODULE_B}", &module(b))
        .replace("${ARGUS_MODEL_CACHE}", &c.model_cache.display().to_string())
        .replace("${MODEL}", MODEL);
    for l in out.lines().filter(|l| !l.trim_start().starts_with('#')) {
        assert!(
            !l.contains("${"),
            "placeholder left in the Serve config: {l}"
        );
    }
    out
}

/// `serve deploy` of `config` as the Ray user in the head, the way
/// docs/serve.md does it.
fn deploy(c: &Cluster, config: &str) {
    let head = c.container("head");
    let out = with_stdin(
        &[
            "exec",
            "-i",
            &head,
            "timeout",
            "120",
            "argus-agent",
            "ray-tool",
            "serve",
            "deploy",
            "-a",
            "http://127.0.0.1:8265",
            "-",
        ],
        config,
    );
    if !out.status.success() {
        c.dump_logs();
        panic!(
            "serve deploy failed ({})\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        );
    }
}

/// Runs the shell `script` in each worker (as root) and returns its
/// output, each line prefixed with the worker's name.
fn in_workers(c: &Cluster, script: &str) -> String {
    let mut s = String::new();
    for w in ["worker-1", "worker-2"] {
        let out = output(docker().args(["exec", &c.container(w), "sh", "-c", script]));
        for l in text(&out.stdout).lines() {
            s.push_str(&format!("{w}: {l}\n"));
        }
    }
    s
}

/// Serve's and the replicas' logs in the workers, last lines of each.
fn serve_logs(c: &Cluster) -> String {
    in_workers(
        c,
        "for f in /tmp/ray/session_latest/logs/serve/replica_*.log \
         /tmp/ray/session_latest/logs/worker-*.err; do \
         echo \"=== $f\"; tail -n 30 \"$f\"; done 2>/dev/null | tail -n 300",
    )
}

/// Waits until both applications run one healthy replica each (fails at
/// once when one is DEPLOY_FAILED).
fn wait_running(c: &Cluster, timeout: Duration) -> Duration {
    c.wait_serve_running(&[("llm-a", 1), ("llm-b", 1)], timeout)
}

/// Runs `python /fixtures/<script> ARGS` in engine image `image` on the
/// compose network (where `lb` resolves), with the work folder at /work.
fn client(c: &Cluster, image: &str, work: &Path, detach: Option<&str>, args: &[&str]) -> Output {
    client_env(c, image, work, detach, &[], args)
}

/// [`client`] with variables in the client's environment.
fn client_env(
    c: &Cluster,
    image: &str,
    work: &Path,
    detach: Option<&str>,
    env: &[(&str, &str)],
    args: &[&str],
) -> Output {
    let fixtures = format!(
        "{}:/fixtures:ro",
        workspace_root().join("tests/fixtures").display()
    );
    let work = format!("{}:/work", work.display());
    let network = format!("{}_default", c.project);
    let mut cmd = docker();
    cmd.arg("run");
    match detach {
        Some(name) => cmd.args(["-d", "--name", name]),
        None => cmd.arg("--rm"),
    };
    for (k, v) in env {
        cmd.args(["-e", &format!("{k}={v}")]);
    }
    cmd.args([
        "--network",
        &network,
        "-v",
        &fixtures,
        "-v",
        &work,
        image,
        "python",
    ]);
    output(cmd.args(args))
}

/// Runs `python ARGS` in engine image `image` with no network, as this
/// test's user, the fixtures at /fixtures and the cluster's model cache at
/// /cache (writable: the models are made there); returns its stdout.
fn offline_python(c: &Cluster, image: &str, args: &[&str]) -> String {
    let me = format!("{}:{}", nix::unistd::getuid(), nix::unistd::getgid());
    let fixtures = format!(
        "{}:/fixtures:ro",
        workspace_root().join("tests/fixtures").display()
    );
    let cache = format!("{}:/cache", c.model_cache.display());
    run(docker()
        .args([
            "run",
            "--rm",
            "--network",
            "none",
            "-u",
            &me,
            "-e",
            "HOME=/tmp",
            "-v",
            &fixtures,
            "-v",
            &cache,
            image,
            "python",
        ])
        .args(args))
}

fn last_json(what: &str, o: &Output) -> Value {
    let stdout = text(&o.stdout);
    let last = stdout.lines().last().unwrap_or_default().to_string();
    serde_json::from_str(&last).unwrap_or_else(|e| {
        panic!(
            "{what}: output is not JSON ({e}): {stdout}\n--- stderr\n{}",
            text(&o.stderr)
        )
    })
}

/// Checks an OpenAI-style error answer: 4xx and a body with a message.
fn assert_openai_error(name: &str, v: &Value) {
    let status = v["status"].as_u64().unwrap_or(0);
    assert!(
        (400..500).contains(&status),
        "{name}: expected a 4xx status, got {v}"
    );
    let body = &v["body"];
    let err = if body.get("error").is_some() {
        &body["error"]
    } else {
        body
    };
    assert!(
        err["message"].as_str().is_some_and(|m| !m.is_empty())
            && (err.get("type").is_some() || err.get("code").is_some()),
        "{name}: not an OpenAI-style error body: {body}"
    );
}

/// One endpoint's answers (openai_calls.py's output) against the reference.
fn check_answers(who: &str, seen: &Value, reference: &Value, engine: &str) {
    assert_eq!(seen["models"], json!([MODEL]), "{who}: /v1/models");
    assert_eq!(
        seen["engine"],
        json!(engine),
        "{who}: the image that answered"
    );
    let want = reference["cases"].as_array().expect("reference cases");
    let got = seen["cases"].as_array().expect("client cases");
    assert_eq!(want.len(), got.len());
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        let kind = if cases()[i].get("messages").is_some() {
            "chat"
        } else {
            "completion"
        };
        log(&format!(
            "{who} case {i} ({kind}): reference {} tokens {:?}, engine {:?} ({})",
            w["ids"].as_array().map_or(0, |a| a.len()),
            w["text"],
            g["text"],
            g["finish_reason"]
        ));
        assert!(
            w["ids"].as_array().is_some_and(|a| !a.is_empty()),
            "case {i}: the reference decode is empty (EOS first): pick another prompt"
        );
        assert_eq!(g["ids"], w["ids"], "{who} case {i} ({kind}): token ids");
        assert_eq!(g["text"], w["text"], "{who} case {i} ({kind}): text");
        assert_eq!(
            g["stream_text"], w["text"],
            "{who} case {i} ({kind}): streamed text"
        );
        assert!(
            g["stream_chunks"].as_u64().unwrap_or(0) > 1,
            "{who} case {i}: the stream came in one piece: {g}"
        );
        assert_eq!(
            g["usage"]["prompt_tokens"].as_u64(),
            w["prompt_ids"].as_array().map(|a| a.len() as u64),
            "{who} case {i} ({kind}): prompt tokens (same tokenisation and chat template)"
        );
    }
    assert_openai_error(&format!("{who}: unknown model"), &seen["unknown_model"]);
    assert_openai_error(
        &format!("{who}: prompt over the context length"),
        &seen["too_long"],
    );
    assert_openai_error(&format!("{who}: malformed JSON"), &seen["malformed_json"]);
    assert!(
        seen["after_errors"].is_string(),
        "{who}: no answer after the bad requests"
    );
}

/// The engine containers of `image` that run now (any node's shim made them).
fn running_engines(image: &str) -> Vec<String> {
    let out = run(docker().args([
        "ps",
        "-q",
        "--no-trunc",
        "--filter",
        &format!("ancestor={image}"),
    ]));
    out.lines().map(str::to_string).collect()
}

/// Waits until the progress of the load clients writing to `dir`
/// satisfies `ok`; returns it.
fn wait_progress(dir: &Path, what: &str, timeout: Duration, ok: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    let mut last = Value::Null;
    while start.elapsed() < timeout {
        if let Ok(s) = std::fs::read_to_string(dir.join("progress.json")) {
            if let Ok(v) = serde_json::from_str::<Value>(&s) {
                if ok(&v) {
                    log(&format!(
                        "{what}: after {:.1} s: {v}",
                        start.elapsed().as_secs_f64()
                    ));
                    return v;
                }
                last = v;
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    panic!("{what}: not within {timeout:?}; last progress: {last}");
}

/// Seconds since the epoch of a Docker timestamp (RFC 3339, nanoseconds).
fn epoch_of(ts: &str) -> f64 {
    let out = run(Command::new("date").args(["-d", ts.trim(), "+%s.%N"]));
    out.trim()
        .parse()
        .unwrap_or_else(|e| panic!("date -d {ts}: {out} ({e})"))
}

/// How long the clients waited around A's upgrade (load result's calls:
/// [name, start, end, ok]).
struct Waits {
    /// A's p99 of the calls answered before the upgrade's deploy.
    a_steady_p99: f64,
    /// The longest call to A answered after the deploy.
    a_max: f64,
    /// The longest call to B answered after the deploy (B is not upgraded:
    /// what the two cores shared with A's cold start cost meanwhile).
    b_max: f64,
}

impl Waits {
    /// The most a call to A may wait: start-first, A's old replica serves
    /// until the new one runs, so A waits no longer than twice its steady
    /// p99 or than B waits beside the cold start (on 2 cores an engine's
    /// start slows every answer), whichever is longer. A stop-first roll
    /// makes a call wait the whole cold start.
    fn bound(&self) -> f64 {
        2.0 * self.a_steady_p99.max(self.b_max)
    }
}

impl std::fmt::Display for Waits {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "A steady p99 {:.2} s, A max after the deploy {:.2} s, B max meanwhile {:.2} s",
            self.a_steady_p99, self.a_max, self.b_max
        )
    }
}

fn upgrade_waits(result: &Value, deploy_at: f64) -> Waits {
    let calls = result["calls"].as_array().cloned().unwrap_or_default();
    let took = |name: &str, after: bool| -> Vec<f64> {
        let mut v: Vec<f64> = calls
            .iter()
            .filter(|c| c[0] == name && c[3] == json!(true))
            .filter_map(|c| Some((c[1].as_f64()?, c[2].as_f64()?)))
            .filter(|(_, end)| (*end > deploy_at) == after)
            .map(|(start, end)| end - start)
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let steady = took("a", false);
    let p99 = steady
        .get(((steady.len() as f64 - 1.0) * 0.99).round().max(0.0) as usize)
        .copied()
        .unwrap_or(0.0);
    Waits {
        a_steady_p99: p99,
        a_max: took("a", true).last().copied().unwrap_or(0.0),
        b_max: took("b", true).last().copied().unwrap_or(0.0),
    }
}

fn now_epoch() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// vLLM's own start-up figures (weights loaded, engine initialised) from
/// the replicas' logs in the workers.
fn vllm_start_lines(c: &Cluster) -> Vec<String> {
    in_workers(
        c,
        "grep -h -E 'Loading weights took|Model loading took|init engine .* took' \
         /tmp/ray/session_latest/logs/worker-*.err /tmp/ray/session_latest/logs/worker-*.out 2>/dev/null",
    )
    .lines()
    .map(|l| l.trim().to_string())
    .collect()
}

/// TTFT and decode rate of `n` streamed answers through `base`, from a
/// client container on the compose network (tests/fixtures/openai_bench.py).
fn bench_through(c: &Cluster, image: &str, work: &Path, base: &str, n: &str) -> Value {
    let out = client(
        c,
        image,
        work,
        None,
        &["/fixtures/openai_bench.py", base, MODEL, n],
    );
    assert!(
        out.status.success(),
        "bench through {base}: {}",
        text(&out.stderr)
    );
    last_json(&format!("bench through {base}"), &out)
}

/// The same bench against the same engine image, model and engine options
/// called directly: vLLM's own OpenAI server started inside the engine
/// container `engine` on its loopback, the client beside it (no Serve, no
/// lb, no shim on the path). The server is stopped afterwards.
fn bench_direct(engine: &str, n: &str) -> Value {
    let port = start_direct(engine, MODEL, 256, 4);
    let script = workspace_root().join("tests/fixtures/openai_bench.py");
    let out = Command::new("docker")
        .args(["exec", "-i", engine, "python", "-"])
        .args([&format!("http://127.0.0.1:{port}/v1"), MODEL, n])
        .stdin(std::fs::File::open(script).unwrap())
        .output()
        .unwrap();
    stop_direct(engine);
    assert!(out.status.success(), "direct bench: {}", text(&out.stderr));
    last_json("direct bench", &out)
}

/// Starts vLLM's own OpenAI server inside the engine container `engine`
/// on its loopback, on `model` from the model cache with the endpoints'
/// CPU engine options, and returns its port once it answers.
fn start_direct(engine: &str, model: &str, max_len: u32, max_seqs: u32) -> &'static str {
    let port = "18001";
    run(docker().args([
        "exec",
        "-d",
        engine,
        "sh",
        "-c",
        &format!(
            "echo $$ > /tmp/direct.pid; TORCHDYNAMO_DISABLE=1 exec python -m vllm.entrypoints.openai.api_server \
             --model /models/{model} --served-model-name {model} --dtype float32 --enforce-eager \
             --max-model-len {max_len} --max-num-seqs {max_seqs} --host 127.0.0.1 --port {port} > /tmp/direct.log 2>&1"
        ),
    ]));
    let start = Instant::now();
    loop {
        let up = output(docker().args([
            "exec",
            engine,
            "python",
            "-c",
            &format!(
                "import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/health', timeout=5)"
            ),
        ]));
        if up.status.success() {
            break;
        }
        if start.elapsed() > Duration::from_secs(900) {
            let log =
                output(docker().args(["exec", engine, "tail", "-n", "40", "/tmp/direct.log"]));
            panic!(
                "vLLM's own server did not start in {engine}: {}",
                text(&log.stdout)
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    log(&format!(
        "direct vLLM server up in {:.1} s",
        start.elapsed().as_secs_f64()
    ));
    port
}

/// Stops the server [`start_direct`] started.
fn stop_direct(engine: &str) {
    let _ = output(docker().args(["exec", engine, "sh", "-c", "kill $(cat /tmp/direct.pid)"]));
}

/// The load client container, removed on drop.
struct Load(String);

/// Stops the load clients writing to `dir` (tests/fixtures/openai_load.py)
/// and returns their result.json; the container is removed.
fn stop_load(dir: &Path, load: Load) -> Value {
    std::fs::write(dir.join("stop"), "").unwrap();
    let waited = run(docker().args(["wait", &load.0]));
    let logs = output(docker().args(["logs", &load.0]));
    drop(load);
    std::fs::read_to_string(dir.join("result.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_else(|| {
            panic!(
                "no load result in {} (exit {}): {}{}",
                dir.display(),
                waited.trim(),
                text(&logs.stdout),
                text(&logs.stderr)
            )
        })
}

impl Drop for Load {
    fn drop(&mut self) {
        let _ = output(docker().args(["rm", "-f", &self.0]));
    }
}

#[test]
fn two_vllm_versions_answer_as_the_reference_through_the_lb_and_one_upgrades_without_loss() {
    require_docker();

    // 1. Images: the node's, the lb's and two CPU engines (no-ops when built).
    let ((img_old, img_new), build) = phase("images", || {
        build_images(false);
        build_lb_image();
        (build_cpu_engine_image(OLD), build_cpu_engine_image(NEW))
    });
    for img in [&img_old, &img_new] {
        let size = run(docker().args(["image", "inspect", "--format", "{{.Size}}", img]));
        log(&format!(
            "image {img}: {:.2} GB",
            size.trim().parse::<f64>().unwrap_or(0.0) / 1e9
        ));
    }

    // 2. The cluster with its lb.
    let serve_port = free_port().to_string();
    // A drain waits for the replicas' new copies on the other worker: vLLM
    // cold starts (two at once when both engines ran there; measured 187 s
    // for the whole drain on this 2-core box, quiet), so the drain bound
    // and the workers' stop timeout are sized for a loaded box
    // (docs/serve.md "Sizing the drain timeout").
    let c = Cluster::up_with_lb(
        &serve_port,
        &[
            ("ARGUS_DRAIN_TIMEOUT_S", "600"),
            ("ARGUS_WORKER_STOP_GRACE_PERIOD", "620s"),
        ],
        &[],
    );

    // 3. The model in the model cache, and the reference decodes, made in
    // engine image A while the nodes start. Written as this test's user;
    // the engines read it through a read-only bind.
    let work = c.tmpdir.join("work");
    std::fs::create_dir_all(work.join("load")).unwrap();
    run(Command::new("chmod").args(["-R", "0777"]).arg(&work));
    std::fs::write(work.join("cases.json"), cases().to_string()).unwrap();
    let (reference, _) = phase("model and reference decode", || {
        offline_python(
            &c,
            &img_old,
            &[
                "/fixtures/tiny_llama.py",
                "make",
                &format!("/cache/{MODEL}"),
            ],
        );
        let out = reference_run(&c, &img_old, &work, "reference", "/work/cases.json");
        let last = out.lines().last().unwrap_or_default().to_string();
        serde_json::from_str::<Value>(&last)
            .unwrap_or_else(|e| panic!("reference output is not JSON ({e}): {out}"))
    });
    c.wait_nodes("three nodes alive", Duration::from_secs(300), |n| {
        n.len() == 3
    });

    // 4. Both endpoints, `serve deploy`ed from the product's config.
    let (_, init) = phase("serve deploy until both endpoints RUNNING", || {
        deploy(&c, &endpoints_config(&c, OLD, NEW));
        wait_running(&c, DEPLOY_TIMEOUT)
    });
    let engines_old = running_engines(&img_old);
    assert_eq!(
        engines_old.len(),
        1,
        "endpoint A: one engine container of {img_old}: {engines_old:?}"
    );
    // The model cache is read-only in the engine.
    let touch = output(docker().args([
        "exec",
        &engines_old[0],
        "touch",
        &format!("/models/{MODEL}/x"),
    ]));
    assert!(
        !touch.status.success(),
        "the model cache is writable in the engine container"
    );

    // 5. Each endpoint through the lb, with the official client.
    let base = |e: &str| format!("http://lb:8000/{e}/v1");
    let (_, calls) = phase("client calls through the lb (both endpoints)", || {
        for (e, vllm) in [("a", OLD), ("b", NEW)] {
            // The lb sends to a worker once its proxy answers its check.
            let start = Instant::now();
            loop {
                let probe = client(
                    &c,
                    &img_new,
                    &work,
                    None,
                    &[
                        "-c",
                        "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=30)",
                        &format!("{}/models", base(e)),
                    ],
                );
                if probe.status.success() {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(180),
                    "the lb does not reach endpoint {e}: {}",
                    text(&probe.stderr)
                );
                std::thread::sleep(Duration::from_secs(1));
            }
            let out = client(
                &c,
                &img_new,
                &work,
                None,
                &[
                    "/fixtures/openai_calls.py",
                    &base(e),
                    MODEL,
                    "/work/cases.json",
                ],
            );
            assert!(
                out.status.success(),
                "endpoint {e}: client failed: {}{}\n{}",
                text(&out.stdout),
                text(&out.stderr),
                serve_logs(&c)
            );
            let seen = last_json(&format!("endpoint {e}"), &out);
            check_answers(
                &format!("endpoint {e}"),
                &seen,
                &reference,
                &engine_header(vllm),
            );
            log(&format!(
                "endpoint {e} (vLLM {vllm}): openai {}, errors {} / {} / {}, first answer {:.2} s",
                seen["openai"],
                seen["unknown_model"]["status"],
                seen["too_long"]["status"],
                seen["malformed_json"]["status"],
                seen["cases"][0]["seconds"].as_f64().unwrap_or(0.0)
            ));
        }
    });
    // No replica lost to the bad requests.
    wait_running(&c, Duration::from_secs(60));

    // The cost of the path (Serve + lb + shim) on streamed answers: always
    // through the lb; against vLLM's own server in the same container with
    // ARGUS_ENGINE_BENCH=1 (scripts/bench-engine.sh), which starts a second
    // engine.
    let lb_bench = bench_through(&c, &img_new, &work, &base("a"), "10");
    log(&format!("bench through the lb (endpoint A): {lb_bench}"));
    let direct = (std::env::var("ARGUS_ENGINE_BENCH").as_deref() == Ok("1"))
        .then(|| bench_direct(&engines_old[0], "10"));
    if let Some(d) = &direct {
        log(&format!(
            "bench direct (vLLM's server in A's container): {d}"
        ));
    }
    let b_engine = running_engines(&img_new);
    assert_eq!(
        b_engine.len(),
        1,
        "endpoint B: one engine container: {b_engine:?}"
    );

    // 6. The upgrade of A under load on both.
    let load_name = format!("{}-load", c.project);
    let load = Load(load_name.clone());
    let started = client(
        &c,
        &img_new,
        &work,
        Some(&load_name),
        &[
            "/fixtures/openai_load.py",
            "/work/load",
            MODEL,
            &format!("a={}", base("a")),
            &format!("b={}", base("b")),
        ],
    );
    assert!(
        started.status.success(),
        "load clients did not start: {}",
        text(&started.stderr)
    );
    wait_progress(
        &work.join("load"),
        "both endpoints answer the load",
        Duration::from_secs(300),
        |v| v["a"]["ok"].as_u64() >= Some(3) && v["b"]["ok"].as_u64() >= Some(3),
    );
    let new_a = engine_header(NEW);
    let deploy_at = now_epoch();
    let (first_new_at, upgrade) = phase("upgrade A until it answers from the new image", || {
        deploy(&c, &endpoints_config(&c, NEW, NEW));
        let before = wait_progress(
            &work.join("load"),
            "A answers from the new image",
            DEPLOY_TIMEOUT,
            |v| v["a"]["engines"][&new_a].as_u64() >= Some(1),
        );
        let first_new_at = now_epoch();
        let n = before["a"]["engines"][&new_a].as_u64().unwrap_or(0);
        wait_running(&c, DEPLOY_TIMEOUT);
        // A few more answers after Serve calls it done.
        wait_progress(
            &work.join("load"),
            "A keeps answering from the new image",
            Duration::from_secs(300),
            |v| {
                v["a"]["engines"][&new_a].as_u64() >= Some(n + 5)
                    && v["a"]["last_engine"] == json!(new_a)
            },
        );
        first_new_at
    });
    // A's cold start, split: until the shim created its engine container,
    // until the container ran, until it answered (Ray worker, Serve replica,
    // vLLM engine init and model load; vLLM's own figures below).
    let new_engine = running_engines(&img_new)
        .into_iter()
        .find(|id| !b_engine.contains(id))
        .expect("A's new engine container");
    let times = run(docker().args([
        "inspect",
        "--format",
        "{{.Created}} {{.State.StartedAt}}",
        &new_engine,
    ]));
    let (created, started) = times.trim().split_once(' ').expect("two timestamps");
    let (created, started) = (epoch_of(created), epoch_of(started));
    let cold = (
        created - deploy_at,
        started - created,
        first_new_at - started,
    );
    let start_lines = vllm_start_lines(&c);
    let result = stop_load(&work.join("load"), load);
    log(&format!(
        "load result: a {}, b {}",
        result["a"], result["b"]
    ));
    let (a, b) = (&result["a"], &result["b"]);
    let waits = upgrade_waits(&result, deploy_at);
    log(&format!(
        "waits around the upgrade of A (start-first): {waits}"
    ));
    assert!(
        waits.a_max <= waits.bound(),
        "a request to A waited {:.2} s during its upgrade, over the bound {:.2} s \
         (twice A's steady p99 or B's longest wait meanwhile, whichever is longer): a stop-first roll? {waits}",
        waits.a_max,
        waits.bound()
    );
    assert_eq!(
        a["failed"],
        json!(0),
        "endpoint A lost requests during its own upgrade: {a}"
    );
    assert_eq!(
        b["failed"],
        json!(0),
        "endpoint B lost requests while A was upgraded: {b}"
    );
    assert!(b["ok"].as_u64() > Some(0), "endpoint B never answered: {b}");
    assert_eq!(
        b["engines"]
            .as_object()
            .map(|m| m.keys().cloned().collect::<Vec<_>>()),
        Some(vec![engine_header(NEW)]),
        "endpoint B answered from another image: {b}"
    );
    assert_eq!(
        a["last_engine"],
        json!(new_a),
        "endpoint A after the upgrade: {a}"
    );
    assert!(
        running_engines(&img_old).is_empty(),
        "the old engine container of A still runs: {:?}",
        running_engines(&img_old)
    );
    assert_eq!(
        running_engines(&img_new).len(),
        2,
        "one engine each for A and B"
    );

    // 7. A worker leaves on purpose while streamed answers are in flight.
    let drain = drain_under_streams(&c, &img_new, &work, &new_engine);

    // 8. Embeddings: the same model as a pooling model on both versions.
    let (embedded, _) = phase("embeddings on both versions", || {
        embeddings(&c, &img_old, &img_new, &work)
    });

    eprintln!(
        "engine_vllm cold start of A on {NEW}: serve deploy -> container created {:.1} s, \
         created -> running {:.1} s, running -> first answer {:.1} s (total {:.1} s)\n\
         vLLM's start-up lines:\n  {}",
        cold.0,
        cold.1,
        cold.2,
        first_new_at - deploy_at,
        start_lines.join("\n  ")
    );
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    match &direct {
        Some(d) => eprintln!(
            "engine_vllm bench (10 streamed answers of 64 tokens, median): through the lb TTFT {:.3} s, \
             {:.1} tok/s; direct TTFT {:.3} s, {:.1} tok/s; ratio lb/direct TTFT {:.2}, tok/s {:.2}",
            f(&lb_bench, "ttft_s"),
            f(&lb_bench, "tok_s"),
            f(d, "ttft_s"),
            f(d, "tok_s"),
            f(&lb_bench, "ttft_s") / f(d, "ttft_s"),
            f(&lb_bench, "tok_s") / f(d, "tok_s")
        ),
        None => eprintln!(
            "engine_vllm bench (10 streamed answers of 64 tokens, median): through the lb TTFT {:.3} s, \
             {:.1} tok/s (ARGUS_ENGINE_BENCH=1 adds the direct figures)",
            f(&lb_bench, "ttft_s"),
            f(&lb_bench, "tok_s")
        ),
    }
    eprintln!(
        "engine_vllm figures: images {:.1} s, both endpoints up {:.1} s, client calls {:.1} s, \
         upgrade {:.1} s; during the upgrade B {} ok / {} failed (p50 {:.2} s, max {:.2} s), \
         A {} ok / {} failed ({} from {OLD}, {} from {NEW}; errors {})",
        build.as_secs_f64(),
        init.as_secs_f64(),
        calls.as_secs_f64(),
        upgrade.as_secs_f64(),
        b["ok"],
        b["failed"],
        b["p50_s"].as_f64().unwrap_or(0.0),
        b["max_s"].as_f64().unwrap_or(0.0),
        a["ok"],
        a["failed"],
        a["engines"][engine_header(OLD)],
        a["engines"][&new_a],
        a["errors"]
    );
    eprintln!("engine_vllm drain under streamed load: {drain}");
    eprintln!("engine_vllm embeddings: {embedded}");
}

/// `docker stop` of the worker that runs `engine` (endpoint A's engine)
/// while clients stream chat completions from both endpoints through the
/// lb, then `docker start`: its agent drains first (Serve starts the
/// replicas on the other worker, the lb stops sending new requests to this
/// one, the streams in flight finish), so every streamed answer comes
/// whole (tests/fixtures/openai_load.py STREAM=1: finish_reason "length"
/// and every token). Returns the figures.
/// `python tiny_llama.py MODE /cache/MODEL FILE` in `image` with no
/// network, the model cache and the work folder read-only: transformers'
/// reference of the same weights.
fn reference_run(c: &Cluster, image: &str, work: &Path, mode: &str, file: &str) -> String {
    run(docker().args([
        "run",
        "--rm",
        "--network",
        "none",
        "-e",
        "HOME=/tmp",
        "-v",
        &format!(
            "{}:/fixtures:ro",
            workspace_root().join("tests/fixtures").display()
        ),
        "-v",
        &format!("{}:/cache:ro", c.model_cache.display()),
        "-v",
        &format!("{}:/work:ro", work.display()),
        image,
        "python",
        "/fixtures/tiny_llama.py",
        mode,
        &format!("/cache/{MODEL}"),
        file,
    ]))
}

/// The texts embedded.
const EMBED_INPUTS: [&str; 3] = [
    "hello world",
    "the quick brown fox jumps over a lazy dog",
    "ray serve vllm embedding agent shim container image cache",
];

/// The endpoints' config turned into embedding endpoints: the same model
/// as a pooling model (`runner: pooling`, last-token pooling, normalised),
/// llm-a's image as /ea, llm-b's as /eb. Deploying it replaces A and B.
fn embedding_config(c: &Cluster) -> String {
    let cfg = endpoints_config(c, OLD, NEW)
        .replace("name: llm-a", "name: embed-a")
        .replace("name: llm-b", "name: embed-b")
        .replace("route_prefix: /a", "route_prefix: /ea")
        .replace("route_prefix: /b", "route_prefix: /eb")
        .replace(
            "max_num_seqs: 4",
            "max_num_seqs: 4\n        runner: pooling\n        pooler_config: {pooling_type: LAST, normalize: true}",
        );
    assert_eq!(
        cfg.matches("\n        runner: pooling\n").count(),
        2,
        "both endpoints' engine_kwargs get the pooling runner:\n{cfg}"
    );
    cfg
}

/// `/v1/embeddings` of both versions through the lb, with the official
/// client, against transformers' reference of the same weights (cosine at
/// least 0.9999, the same prompt tokens). Returns the figures.
fn embeddings(c: &Cluster, img_old: &str, img_new: &str, work: &Path) -> String {
    std::fs::write(
        work.join("embed_inputs.json"),
        serde_json::to_string(&EMBED_INPUTS).unwrap(),
    )
    .unwrap();
    let reference = reference_run(c, img_old, work, "embed", "/work/embed_inputs.json");
    let reference: Value = serde_json::from_str(reference.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("embedding reference is not JSON ({e}): {reference}"));
    deploy(c, &embedding_config(c));
    c.wait_serve_running(&[("embed-a", 1), ("embed-b", 1)], DEPLOY_TIMEOUT);
    let script = "import json, sys, openai\n\
        c = openai.OpenAI(base_url=sys.argv[1], api_key='unused', max_retries=0, timeout=120)\n\
        raw = c.embeddings.with_raw_response.create(model=sys.argv[2], input=json.load(open(sys.argv[3])))\n\
        r = raw.parse()\n\
        print(json.dumps({'engine': raw.headers.get('x-argus-engine'), 'prompt_tokens': r.usage.prompt_tokens, \
        'vectors': [d.embedding for d in r.data]}))";
    let mut figures = Vec::new();
    for (route, vllm) in [("ea", OLD), ("eb", NEW)] {
        let out = client(
            c,
            img_new,
            work,
            None,
            &[
                "-c",
                script,
                &format!("http://lb:8000/{route}/v1"),
                MODEL,
                "/work/embed_inputs.json",
            ],
        );
        let got = last_json(&format!("embeddings of /{route}"), &out);
        assert_eq!(
            got["engine"],
            json!(engine_header(vllm)),
            "/{route}: answered by another engine image"
        );
        let want = reference["embeddings"]
            .as_array()
            .expect("reference embeddings");
        let vectors = got["vectors"].as_array().expect("embedding vectors");
        assert_eq!(
            vectors.len(),
            want.len(),
            "/{route}: {} vectors",
            vectors.len()
        );
        let tokens: usize = want
            .iter()
            .map(|w| w["ids"].as_array().map_or(0, Vec::len))
            .sum();
        assert_eq!(
            got["prompt_tokens"],
            json!(tokens),
            "/{route}: prompt tokens differ from the reference tokenizer's"
        );
        let mut worst = 1.0f64;
        for (i, (v, w)) in vectors.iter().zip(want).enumerate() {
            let f = |x: &Value| -> Vec<f64> {
                x.as_array()
                    .map(|a| a.iter().filter_map(Value::as_f64).collect())
                    .unwrap_or_default()
            };
            let (a, b) = (f(v), f(&w["vector"]));
            assert_eq!(
                a.len(),
                b.len(),
                "/{route} input {i}: dimension {} vs {}",
                a.len(),
                b.len()
            );
            let dot: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
            let cos = dot / (norm(&a) * norm(&b));
            assert!(
                cos >= 0.9999,
                "/{route} (vLLM {vllm}) input {i} {:?}: cosine {cos:.6} with transformers' embedding",
                EMBED_INPUTS[i]
            );
            worst = worst.min(cos);
        }
        figures.push(format!(
            "vLLM {vllm}: {} vectors of {} dims, lowest cosine {worst:.6}",
            vectors.len(),
            vectors[0].as_array().map_or(0, Vec::len)
        ));
    }
    figures.join("; ")
}

/// What the load balancer, Serve's controller and the drained worker's
/// proxy and replicas logged about requests cut during a drain (printed
/// before the assertion, so that CI's tail says which hop closed them):
/// the lb's lines whose termination state is not a normal end (the
/// server-side `S?` or client-side `C?` codes name who closed), the
/// controller's lines about migration, proxies and health, and errors in
/// the worker's proxy and replica logs (every Ray session of the
/// container: it was restarted since).
fn stream_cut_evidence(c: &Cluster, worker: &str, since: &str) -> String {
    let lb = output(docker().args(["logs", "--since", since, &c.container("lb")]));
    let lb_lines: Vec<String> = text(&lb.stdout)
        .lines()
        .chain(text(&lb.stderr).lines())
        .filter(|l| {
            // httplog (raw): client [date] frontend backend/server timers
            // status bytes - - TERM conns queue "METHOD path ..."
            l.split_whitespace()
                .nth(9)
                .is_some_and(|t| t.len() == 4 && !t.starts_with("--"))
        })
        .map(str::to_string)
        .collect();
    let tail = |v: &[String], n: usize| v[v.len().saturating_sub(n)..].join("\n");
    let controller = output(docker().args([
        "exec",
        &c.container("head"),
        "sh",
        "-c",
        "grep -h -E 'Migrat|Stopping|proxy|Proxy|unhealthy|health check|Killing|argus|draining' \
         /tmp/ray/session_*/logs/serve/controller_*.log 2>/dev/null | tail -n 40",
    ]));
    let here = output(docker().args([
        "exec",
        &c.container(worker),
        "sh",
        "-c",
        "grep -h -E 'ERROR|WARN|rror|ancel|drain' /tmp/ray/session_*/logs/serve/proxy_*.log \
         /tmp/ray/session_*/logs/serve/replica_*.log 2>/dev/null | tail -n 40",
    ]));
    format!(
        "--- evidence of the cut streams\nlb, abnormal ends ({} lines, last 20):\n{}\n\
         serve controller (head):\n{}\n{worker}'s proxy and replica logs:\n{}",
        lb_lines.len(),
        tail(&lb_lines, 20),
        text(&controller.stdout).trim_end(),
        text(&here.stdout).trim_end()
    )
}

fn drain_under_streams(c: &Cluster, image: &str, work: &Path, engine: &str) -> String {
    let dir = work.join("stream");
    std::fs::create_dir_all(&dir).unwrap();
    run(Command::new("chmod").arg("0777").arg(&dir));
    let owner = inspect(engine, "{{index .Config.Labels \"io.argus.shim.owner\"}}");
    let worker = ["worker-1", "worker-2"]
        .into_iter()
        .find(|w| c.container(w) == owner)
        .unwrap_or_else(|| panic!("A's engine {engine} belongs to no worker ({owner})"));
    let name = format!("{}-stream", c.project);
    let load = Load(name.clone());
    let started = client_env(
        c,
        image,
        work,
        Some(&name),
        &[("STREAM", "1"), ("MAX_TOKENS", "96")],
        &[
            "/fixtures/openai_load.py",
            "/work/stream",
            MODEL,
            "a=http://lb:8000/a/v1",
            "b=http://lb:8000/b/v1",
        ],
    );
    assert!(
        started.status.success(),
        "streaming clients did not start: {}",
        text(&started.stderr)
    );
    let ok = |v: &Value, e: &str| v[e]["ok"].as_u64().unwrap_or(0);
    let before = wait_progress(
        &dir,
        "both endpoints stream",
        Duration::from_secs(300),
        |v| ok(v, "a") >= 5 && ok(v, "b") >= 5,
    );
    let id = c.container(worker);
    let since = format!("{}", now_epoch() as u64);
    let stop_at = now_epoch();
    run(docker().args(["stop", &id]));
    let stopped_at = now_epoch();
    let code = inspect(&id, "{{.State.ExitCode}}");
    let logs = output(docker().args(["logs", "--since", &since, &id]));
    let agent_log = text(&logs.stdout) + &text(&logs.stderr);
    let drain_lines: Vec<&str> = agent_log.lines().filter(|l| l.contains("drain")).collect();
    log(&format!(
        "docker stop {worker} (A's engine): {:.1} s, exit {code}; {drain_lines:?}",
        stopped_at - stop_at
    ));
    assert_eq!(code, "0", "{worker} was killed mid-drain:\n{agent_log}");
    assert!(
        agent_log.lines().any(|l| l.contains("drain done")),
        "{worker} did not drain:\n{agent_log}"
    );
    let after = wait_progress(
        &dir,
        "both endpoints stream from the other worker",
        Duration::from_secs(300),
        |v| ok(v, "a") >= ok(&before, "a") + 5 && ok(v, "b") >= ok(&before, "b") + 5,
    );
    run(docker().args(["start", &id]));
    c.wait_nodes(&format!("{worker} back"), Duration::from_secs(300), |n| {
        n.len() == 3
    });
    wait_progress(
        &dir,
        "streams after the restart",
        Duration::from_secs(300),
        |v| ok(v, "a") >= ok(&after, "a") + 3 && ok(v, "b") >= ok(&after, "b") + 3,
    );
    let result = stop_load(&dir, load);
    let (a, b) = (&result["a"], &result["b"]);
    log(&format!("streaming result: a {a}, b {b}"));
    if a["failed"] != json!(0) || b["failed"] != json!(0) {
        eprintln!("{}", stream_cut_evidence(c, worker, &since));
    }
    for (e, r) in [("A", a), ("B", b)] {
        assert_eq!(
            r["failed"],
            json!(0),
            "endpoint {e} lost or cut streamed answers while {worker} drained: {r}"
        );
    }
    // Answers that were streaming while the node drained: started before
    // docker stop returned and ended after it was called.
    let calls = result["calls"].as_array().cloned().unwrap_or_default();
    let overlapping = |from: f64, to: f64| {
        calls
            .iter()
            .filter(|k| k[1].as_f64().unwrap_or(0.0) < to && k[2].as_f64().unwrap_or(0.0) > from)
            .count()
    };
    let (during, at_stop) = (
        overlapping(stop_at, stopped_at),
        overlapping(stop_at, stop_at),
    );
    assert!(
        at_stop > 0,
        "no streamed answer was in flight when {worker} was stopped"
    );
    format!(
        "{worker} drained in {:.1} s (docker stop); streamed answers (96 tokens) A {} ok / {} failed \
         (p50 {:.2} s, max {:.2} s), B {} ok / {} failed; {at_stop} in flight at the stop, \
         {during} during the drain, all whole",
        stopped_at - stop_at,
        a["ok"],
        a["failed"],
        a["p50_s"].as_f64().unwrap_or(0.0),
        a["max_s"].as_f64().unwrap_or(0.0),
        b["ok"],
        b["failed"]
    )
}

// ------------------------------------------------------------ stream sweep

/// The stream benchmark's model (tests/fixtures/bench_llama.py: about 110 M
/// random weights, tens of ms a token on this CPU).
const BENCH_MODEL: &str = "bench-llama";
/// Streamed answers' length in the sweep.
const SWEEP_TOKENS: &str = "64";
/// (concurrency, answers) of the sweep.
const SWEEP: [(u32, u32); 3] = [(1, 10), (8, 24), (32, 64)];

/// One endpoint of vLLM `vllm` on the bench model, in the shape of
/// docker/serve/llm-endpoints.yaml, room for 32 sequences at once.
fn sweep_config(c: &Cluster, vllm: &str) -> String {
    format!(
        r#"proxy_location: EveryNode
http_options:
  host: 0.0.0.0
  port: 8000
applications:
  - name: llm-a
    route_prefix: /a
    import_path: serve.vllm.{module}.app:app_builder
    runtime_env:
      container:
        image: {image}
        run_options: ["--env", "VLLM_CPU_KVCACHE_SPACE=2", "-v", "{cache}:/models:ro"]
    args:
      model: /models/{BENCH_MODEL}
      model_id: {BENCH_MODEL}
      engine_kwargs:
        max_model_len: 512
        max_num_seqs: 32
    deployments:
      - name: VllmOpenAI
        num_replicas: 1
        health_check_timeout_s: 120
        ray_actor_options:
          num_cpus: 0.1
          resources:
            worker_node: 1
"#,
        module = module(vllm),
        image = compose::cpu_engine_image(vllm),
        cache = c.model_cache.display(),
    )
}

/// Runs the sweep (tests/fixtures/openai_sweep.py) with `run_one(conc,
/// answers)` and returns each level's figures.
fn sweep(what: &str, run_one: impl Fn(u32, u32) -> Output) -> Vec<Value> {
    SWEEP
        .iter()
        .map(|&(conc, n)| {
            let out = run_one(conc, n);
            let v = last_json(&format!("{what} sweep at {conc}"), &out);
            log(&format!("sweep {what} concurrency {conc}: {v}"));
            assert_eq!(v["failed"], json!(0), "{what} at {conc}: {v}");
            v
        })
        .collect()
}

/// The stream path's cost, measured where it matters (scripts/bench-engine.sh
/// --stream; not part of scripts/test): one vLLM endpoint on a model with a
/// realistic time per token, streamed at concurrency 1, 8 and 32 through the
/// lb (HAProxy, a worker's Serve proxy, the replica in its engine container)
/// and against vLLM's own server in the same engine container, the client
/// beside it. Figures to target/bench/stream-sweep.json.
#[test]
#[ignore = "a benchmark: scripts/bench-engine.sh --stream"]
fn stream_path_sweep_through_the_lb_and_direct() {
    require_docker();
    let root = workspace_root();
    build_images(false);
    build_lb_image();
    let img = build_cpu_engine_image(NEW);
    let serve_port = free_port().to_string();
    let c = Cluster::up_with_lb(&serve_port, &[], &[]);
    let work = c.tmpdir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    run(Command::new("chmod").args(["-R", "0777"]).arg(&work));
    let (made, _) = phase("bench model", || {
        let out = offline_python(
            &c,
            &img,
            &["/fixtures/bench_llama.py", &format!("/cache/{BENCH_MODEL}")],
        );
        out.lines().last().unwrap_or_default().to_string()
    });
    log(&format!("bench model: {made}"));
    c.wait_nodes("three nodes alive", Duration::from_secs(300), |n| {
        n.len() == 3
    });
    phase("serve deploy until the endpoint runs", || {
        deploy(&c, &sweep_config(&c, NEW));
        c.wait_serve_running(&[("llm-a", 1)], DEPLOY_TIMEOUT)
    });
    let base = "http://lb:8000/a/v1";
    let start = Instant::now();
    while !client(
        &c,
        &img,
        &work,
        None,
        &[
            "-c",
            "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=30)",
            &format!("{base}/models"),
        ],
    )
    .status
    .success()
    {
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "the lb does not reach the endpoint"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let lb = sweep("lb", |conc, n| {
        client(
            &c,
            &img,
            &work,
            None,
            &[
                "/fixtures/openai_sweep.py",
                base,
                BENCH_MODEL,
                &conc.to_string(),
                &n.to_string(),
                SWEEP_TOKENS,
            ],
        )
    });
    // vLLM's own server in the same engine container, same options; the
    // replica's engine beside it stays idle meanwhile.
    let engine = running_engines(&img);
    assert_eq!(engine.len(), 1, "one engine container: {engine:?}");
    let engine = &engine[0];
    let port = start_direct(engine, BENCH_MODEL, 512, 32);
    let script = root.join("tests/fixtures/openai_sweep.py");
    let direct = sweep("direct", |conc, n| {
        Command::new("docker")
            .args(["exec", "-i", engine, "python", "-"])
            .args([
                &format!("http://127.0.0.1:{port}/v1"),
                BENCH_MODEL,
                &conc.to_string(),
                &n.to_string(),
                SWEEP_TOKENS,
            ])
            .stdin(std::fs::File::open(&script).unwrap())
            .output()
            .unwrap()
    });
    stop_direct(engine);
    let result = json!({
        "model": serde_json::from_str::<Value>(&made).unwrap_or(Value::Null),
        "vllm": NEW,
        "tokens": SWEEP_TOKENS,
        "lb": lb,
        "direct": direct,
    });
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("stream-sweep.json"), result.to_string()).unwrap();
    println!("engine_vllm stream sweep: {result}");
}
