//! A real vLLM endpoint in the CPU engine image, checked against a reference.
//!
//! What a user does for a quick check of an engine image, on one box: build
//! the CPU engine image (`scripts/build-images.sh engine --local-base --cpu`,
//! cached by its inputs' hash), start it as a container with a model folder
//! bound read-only, run a single-node Ray and `serve deploy` of the serve
//! module `serve.vllm.v0_12_0.app:app_builder` inside it, and call the
//! published port with the official `openai` Python client.
//!
//! The model is a tiny random-weight Llama with a tokenizer trained on the
//! spot (tests/fixtures/tiny_llama.py, run in the image: it has torch and
//! transformers), so no hub and no download. The oracle is transformers'
//! greedy decode of the same weights and prompt:
//!   - greedy chat and completion equal it token for token (ids, via vLLM's
//!     `return_tokens_as_token_ids`) and in text;
//!   - streaming (server-sent events) yields the same text;
//!   - `/v1/models` names the model;
//!   - an unknown model name, a prompt over the context length and malformed
//!     JSON get OpenAI-style error bodies (`{"error": {"message", "type",
//!     "code"}}` or `{"message", "type", "code"}`) with a 4xx status, and the
//!     endpoint still answers afterwards.
//!
//! The client runs in a container of the same image on the host's network
//! (the image pins `openai`), reaching the engine on its published loopback
//! port. Each phase's wall time is printed (image build, model, reference,
//! container start, Ray start, engine init, first answer).
//!
//! Docker missing is a FAILURE, never a skip. ARGUS_E2E_KEEP=1 leaves the
//! engine container for inspection.
//!
//! Not yet run by `scripts/test` (the test is `#[ignore]`d): its first run
//! on a machine builds the CPU engine image, 9 GB with 4.4 GB downloaded,
//! 15 to 27 minutes on a 2-core box. Run it by hand with
//! `cargo test --test engine_vllm -- --ignored --nocapture`; later runs
//! take about 110 s once the image is cached by its inputs' hash.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "support/compose.rs"]
mod compose;

use compose::{log, output, run, workspace_root};
use serde_json::{json, Value};

const RAY_VERSION: &str = "2.53.0";
const VLLM_VERSION: &str = "0.12.0";
const MODEL_ID: &str = "tiny-llama";
/// Where the model folder is bound in the engine container.
const MODEL_PATH: &str = "/models/tiny-llama";
/// Tokens per greedy answer.
const MAX_TOKENS: u64 = 16;
/// Longest wait for the Serve application to come up (engine init on a
/// loaded 2-core box).
const DEPLOY_TIMEOUT: Duration = Duration::from_secs(900);

fn image() -> String {
    format!("localhost/neutree/engine-vllm:v{VLLM_VERSION}-ray{RAY_VERSION}-cpu")
}

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

/// An engine container, removed on drop (unless ARGUS_E2E_KEEP=1).
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        if std::env::var("ARGUS_E2E_KEEP").as_deref() == Ok("1") {
            log(&format!("ARGUS_E2E_KEEP=1: container {} left", self.0));
            return;
        }
        let _ = docker()
            .args(["rm", "-f", &self.0])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Container {
    fn exec(&self, args: &[&str]) -> Output {
        output(docker().arg("exec").arg(&self.0).args(args))
    }

    fn logs_tail(&self) -> String {
        let out = output(docker().args(["logs", "--tail", "80", &self.0]));
        format!("{}{}", text(&out.stdout), text(&out.stderr))
    }

    /// Ray's and Serve's logs in the container, last lines of each.
    fn ray_logs(&self) -> String {
        let out = self.exec(&[
            "sh",
            "-c",
            "for f in /tmp/ray/session_latest/logs/serve/*.log \
             /tmp/ray/session_latest/logs/worker-*.err; do \
             echo \"=== $f\"; tail -n 40 \"$f\"; done 2>/dev/null | tail -n 400",
        ]);
        text(&out.stdout)
    }
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

fn serve_config() -> String {
    [
        format!("# Written by tests/engine_vllm.rs: the vLLM {VLLM_VERSION} endpoint."),
        "proxy_location: HeadOnly".into(),
        "http_options:".into(),
        "  host: 0.0.0.0".into(),
        "  port: 8000".into(),
        "applications:".into(),
        "  - name: llm".into(),
        "    route_prefix: /".into(),
        "    import_path: serve.vllm.v0_12_0.app:app_builder".into(),
        "    args:".into(),
        format!("      model: {MODEL_PATH}"),
        format!("      model_id: {MODEL_ID}"),
        "      engine_kwargs:".into(),
        "        max_model_len: 256".into(),
        "        max_num_seqs: 4".into(),
        String::new(),
    ]
    .join("\n")
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

#[test]
#[ignore = "builds the 9 GB CPU engine image (4.4 GB from PyPI, 15-27 min on a fresh 2-core machine): \
            not yet in scripts/test, whose 90-minute CI budget it would nearly use up; \
            run it with `cargo test --test engine_vllm -- --ignored`"]
fn cpu_engine_answers_the_openai_api_as_the_reference_decode() {
    let root = workspace_root();
    let fixtures = root.join("tests/fixtures");
    let image = image();

    // 1. The image (a no-op when its inputs' hash matches the built one).
    let (_, build) = phase("image build", || {
        run(Command::new(root.join("scripts/build-images.sh"))
            .current_dir(&root)
            .args([
                "engine",
                "--local-base",
                "--cpu",
                "--engine-version",
                &format!("v{VLLM_VERSION}"),
            ])
            .stderr(Stdio::inherit()))
    });
    let size = run(docker().args(["image", "inspect", "--format", "{{.Size}}", &image]));
    log(&format!(
        "image {image}: {:.2} GB",
        size.trim().parse::<f64>().unwrap_or(0.0) / 1e9
    ));

    // 2. The model folder and the reference decodes, made in the image.
    let tmp = tempfile::Builder::new()
        .prefix("argus-engine-vllm-")
        .tempdir()
        .unwrap();
    let work = tmp.path();
    // The image's user (uid 1000) writes the model folder.
    run(Command::new("chmod").arg("0777").arg(work));
    std::fs::write(work.join("cases.json"), cases().to_string()).unwrap();
    std::fs::write(work.join("serve.yaml"), serve_config()).unwrap();
    let fixtures_bind = format!("{}:/fixtures:ro", fixtures.display());
    let work_bind = format!("{}:/work", work.display());
    let (made, _) = phase("model", || {
        run(docker().args([
            "run",
            "--rm",
            "--network",
            "none",
            "-v",
            &fixtures_bind,
            "-v",
            &work_bind,
            &image,
            "python",
            "/fixtures/tiny_llama.py",
            "make",
            "/work/models/tiny-llama",
        ]))
    });
    log(&format!("model: {}", made.trim()));
    let model_dir = work.join("models/tiny-llama");
    let model_bind = format!("{}:{MODEL_PATH}:ro", model_dir.display());
    let (reference, _) = phase("reference decode (transformers)", || {
        let out = run(docker().args([
            "run",
            "--rm",
            "--network",
            "none",
            "-v",
            &fixtures_bind,
            "-v",
            &format!("{}:/work:ro", work.display()),
            "-v",
            &model_bind,
            &image,
            "python",
            "/fixtures/tiny_llama.py",
            "reference",
            MODEL_PATH,
            "/work/cases.json",
        ]));
        let last = out.lines().last().unwrap_or_default().to_string();
        serde_json::from_str::<Value>(&last)
            .unwrap_or_else(|e| panic!("reference output is not JSON ({e}): {out}"))
    });

    // 3. The engine container: the model read-only, a published loopback port.
    let name = format!("argus-engine-vllm-test-{}", std::process::id());
    let (engine, start) = phase("container start", || {
        let _ = output(docker().args(["rm", "-f", &name]));
        run(docker().args([
            "run",
            "-d",
            "--name",
            &name,
            "--shm-size",
            "1g",
            "-p",
            "127.0.0.1::8000",
            "-e",
            "VLLM_CPU_KVCACHE_SPACE=1",
            "-e",
            "RAY_USAGE_STATS_ENABLED=0",
            // Serve gives a new proxy 5 s to say it is ready; a loaded
            // 2-core box needs more (the proxy is otherwise restarted).
            "-e",
            "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S=60",
            "-v",
            &model_bind,
            "-v",
            &format!("{}/serve.yaml:/etc/argus/serve.yaml:ro", work.display()),
            &image,
            "sleep",
            "infinity",
        ]));
        let engine = Container(name.clone());
        let deadline = Instant::now() + Duration::from_secs(60);
        while !engine.exec(&["true"]).status.success() {
            assert!(Instant::now() < deadline, "container {name} does not run");
            std::thread::sleep(Duration::from_millis(200));
        }
        engine
    });
    let port = run(docker().args(["port", &name, "8000/tcp"]));
    let port = port
        .lines()
        .find_map(|l| l.strip_prefix("127.0.0.1:"))
        .unwrap_or_else(|| panic!("no loopback port published: {port}"))
        .trim()
        .to_string();
    // A read-only bind: the engine cannot write the model folder.
    let touch = engine.exec(&["touch", &format!("{MODEL_PATH}/x")]);
    assert!(
        !touch.status.success(),
        "the model folder is writable in the engine container"
    );

    // 4. Single-node Ray and `serve deploy`, as a user would.
    let (_, ray_start) = phase("ray start", || {
        let out = engine.exec(&[
            "ray",
            "start",
            "--head",
            "--num-cpus=2",
            "--object-store-memory=200000000",
            "--dashboard-host=127.0.0.1",
            "--disable-usage-stats",
        ]);
        assert!(
            out.status.success(),
            "ray start failed: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    });
    let (_, init) = phase("engine init (serve deploy until RUNNING)", || {
        let out = engine.exec(&["serve", "deploy", "/etc/argus/serve.yaml"]);
        assert!(
            out.status.success(),
            "serve deploy failed: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        let deadline = Instant::now() + DEPLOY_TIMEOUT;
        loop {
            let st = engine.exec(&["serve", "status"]);
            let s = text(&st.stdout);
            if s.contains("status: RUNNING") {
                break;
            }
            if s.contains("DEPLOY_FAILED") || s.contains("status: UNHEALTHY") {
                panic!(
                    "the application failed:\n{s}\n--- Ray logs\n{}",
                    engine.ray_logs()
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "not RUNNING within {DEPLOY_TIMEOUT:?}:\n{s}\n--- container\n{}\n--- Ray logs\n{}",
                    engine.logs_tail(),
                    engine.ray_logs()
                );
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    });

    // 5. The official client, from the host's network to the published port.
    let base = format!("http://127.0.0.1:{port}/v1");
    let (seen, calls) = phase("client calls (first answer included)", || {
        let out = output(docker().args([
            "run",
            "--rm",
            "--network",
            "host",
            "-v",
            &fixtures_bind,
            "-v",
            &format!("{}:/work:ro", work.display()),
            &image,
            "python",
            "/fixtures/openai_calls.py",
            &base,
            MODEL_ID,
            "/work/cases.json",
        ]));
        if !out.status.success() {
            panic!(
                "client failed: {}{}\n--- Ray logs\n{}",
                text(&out.stdout),
                text(&out.stderr),
                engine.ray_logs()
            );
        }
        let stdout = text(&out.stdout);
        let last = stdout.lines().last().unwrap_or_default().to_string();
        serde_json::from_str::<Value>(&last)
            .unwrap_or_else(|e| panic!("client output is not JSON ({e}): {stdout}"))
    });
    log(&format!(
        "openai {} client; first answer {:.2} s after RUNNING",
        seen["openai"], seen["cases"][0]["seconds"]
    ));

    assert_eq!(seen["models"], json!([MODEL_ID]), "/v1/models");
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
            "case {i} ({kind}): reference {} tokens {:?}, engine {:?} ({})",
            w["ids"].as_array().map_or(0, |a| a.len()),
            w["text"],
            g["text"],
            g["finish_reason"]
        ));
        assert!(
            w["ids"].as_array().is_some_and(|a| !a.is_empty()),
            "case {i}: the reference decode is empty (EOS first): pick another prompt"
        );
        assert_eq!(g["ids"], w["ids"], "case {i} ({kind}): token ids");
        assert_eq!(g["text"], w["text"], "case {i} ({kind}): text");
        assert_eq!(
            g["stream_text"], w["text"],
            "case {i} ({kind}): streamed text"
        );
        assert!(
            g["stream_chunks"].as_u64().unwrap_or(0) > 1,
            "case {i}: the stream came in one piece: {g}"
        );
        assert_eq!(
            g["usage"]["prompt_tokens"].as_u64(),
            w["prompt_ids"].as_array().map(|a| a.len() as u64),
            "case {i} ({kind}): prompt tokens (same tokenisation and chat template)"
        );
    }
    assert_openai_error("unknown model", &seen["unknown_model"]);
    assert_openai_error("prompt over the context length", &seen["too_long"]);
    assert_openai_error("malformed JSON", &seen["malformed_json"]);
    log(&format!(
        "errors: unknown model {}, too long {}, malformed JSON {}",
        seen["unknown_model"]["status"],
        seen["too_long"]["status"],
        seen["malformed_json"]["status"]
    ));
    assert!(
        seen["after_errors"].is_string(),
        "no answer after the bad requests"
    );
    eprintln!(
        "engine_vllm figures: image build {:.1} s, container start {:.1} s, ray start {:.1} s, \
         engine init {:.1} s, first answer {:.2} s, all calls {:.1} s",
        build.as_secs_f64(),
        start.as_secs_f64(),
        ray_start.as_secs_f64(),
        init.as_secs_f64(),
        seen["cases"][0]["seconds"].as_f64().unwrap_or(0.0),
        calls.as_secs_f64()
    );
}
