use super::*;

const CSV_FIELDS: &str = smi::FIELDS;

fn opts(dir: &Path, mode: PreflightMode) -> PreflightOptions {
    PreflightOptions {
        mode,
        dev_root: dir.join("root"),
        timeout: Duration::from_secs(5),
        log_dir: dir.join("logs"),
        fix_dir: dir.join("state/libcuda"),
        nvidia_smi: dir.join("no-such-nvidia-smi"),
        visible_devices: None,
        cuda_visible_devices: None,
        triton_libcuda_path: None,
        lib_probe: LibProbe::InProcess,
    }
}

fn make_dev(root: &Path, gpus: usize, ctl: bool, uvm: bool) {
    let dev = root.join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    for i in 0..gpus {
        std::fs::write(dev.join(format!("nvidia{i}")), "").unwrap();
    }
    if ctl {
        std::fs::write(dev.join("nvidiactl"), "").unwrap();
    }
    if uvm {
        std::fs::write(dev.join("nvidia-uvm"), "").unwrap();
    }
    // Not GPU nodes.
    std::fs::write(dev.join("nvidia-uvm-tools"), "").unwrap();
    std::fs::write(dev.join("nvidia-caps"), "").unwrap();
}

#[test]
fn classes_map_to_the_documented_exit_codes() {
    assert_eq!(Class::InfrastructureFatal.exit_code(), 69);
    assert_eq!(Class::Transient.exit_code(), 75);
    assert_eq!(Class::Configuration.exit_code(), 78);
    assert_eq!(
        serde_json::to_string(&Class::InfrastructureFatal).unwrap(),
        "\"infrastructure-fatal\""
    );
    assert!(Class::InfrastructureFatal > Class::Transient);
    assert!(Class::Transient > Class::Configuration);
}

#[test]
fn nvidia_visible_devices_is_parsed_like_the_container_toolkit() {
    assert_eq!(Requested::parse(None), Requested::Nothing);
    for v in ["", " ", "void", "none"] {
        assert_eq!(Requested::parse(Some(v)), Requested::Nothing, "{v:?}");
    }
    assert_eq!(Requested::parse(Some("all")), Requested::All);
    assert_eq!(Requested::parse(Some("0")), Requested::Count(1));
    assert_eq!(Requested::parse(Some("0,1,3")), Requested::Count(3));
    assert_eq!(
        Requested::parse(Some("GPU-aaa, GPU-bbb,")),
        Requested::Count(2)
    );
}

#[test]
fn csv_rows_parse_with_unsupported_counters_as_absent() {
    let out = "0, GPU-a, NVIDIA A100-SXM4-80GB, 535.183.01, 81920, 4, 0, No\n\
               1, GPU-b, NVIDIA A100-SXM4-80GB, 535.183.01, 81920, 70000, 3, Yes\n\
               2, GPU-c, NVIDIA GeForce RTX 4090, 535.183.01, 24564, 1, [N/A], [N/A]\n";
    let g = smi::parse_csv(out, CSV_FIELDS).unwrap();
    assert_eq!(g.len(), 3);
    assert_eq!(g[1].index, 1);
    assert_eq!(g[1].uuid, "GPU-b");
    assert_eq!(g[1].memory_used_mib, Some(70000));
    assert_eq!(g[1].ecc_uncorrected_volatile, Some(3));
    assert_eq!(g[1].retired_pages_pending, Some(true));
    assert_eq!(g[2].ecc_uncorrected_volatile, None);
    assert_eq!(g[2].retired_pages_pending, None);
    let basic = smi::parse_csv("0, GPU-a, T4, 470.1, 15360, 0\n", smi::BASIC_FIELDS).unwrap();
    assert_eq!(basic[0].ecc_uncorrected_volatile, None);
}

#[test]
fn csv_with_wrong_field_count_or_index_is_rejected() {
    assert!(smi::parse_csv("0, GPU-a, x\n", CSV_FIELDS).is_err());
    assert!(smi::parse_csv("Failed to initialize NVML: Unknown Error\n", CSV_FIELDS).is_err());
    assert!(smi::parse_csv("x, GPU-a, A, 1, 1, 1, 0, No\n", CSV_FIELDS).is_err());
    assert_eq!(smi::parse_csv("\n", CSV_FIELDS).unwrap(), vec![]);
}

#[test]
fn nvidia_smi_exit_codes_are_classified_by_the_research_table() {
    let cases = [
        (9, "", Class::InfrastructureFatal, "driver-not-loaded"),
        (12, "", Class::InfrastructureFatal, "nvml-library-not-found"),
        (14, "", Class::InfrastructureFatal, "inforom-corrupted"),
        (15, "", Class::InfrastructureFatal, "gpu-lost"),
        (
            18,
            "",
            Class::InfrastructureFatal,
            "driver-library-version-mismatch",
        ),
        (
            255,
            "Failed to initialize NVML: Driver/library version mismatch",
            Class::InfrastructureFatal,
            "driver-library-version-mismatch",
        ),
        (
            6,
            "No devices were found",
            Class::InfrastructureFatal,
            "no-gpus-found",
        ),
        (4, "", Class::Configuration, "gpu-no-permission"),
        (6, "", Class::Transient, "nvidia-smi-failed"),
        (255, "", Class::Transient, "nvidia-smi-failed"),
    ];
    for (code, out, class, sig) in cases {
        let (c, s, _) = smi::classify_exit(code, out);
        assert_eq!((c, s), (class, sig), "exit {code} {out:?}");
    }
}

#[test]
fn library_return_codes_are_classified() {
    assert_eq!(libs::classify_nvml(9).0, Class::InfrastructureFatal);
    assert_eq!(libs::classify_nvml(15).1, "gpu-lost");
    assert_eq!(libs::classify_nvml(17).0, Class::Configuration);
    assert_eq!(libs::classify_nvml(999).0, Class::Transient);
    assert_eq!(libs::classify_cuda(100).0, Class::Configuration);
    assert_eq!(libs::classify_cuda(34).1, "cuda-stub-library");
    assert_eq!(libs::classify_cuda(803).0, Class::Configuration);
    assert_eq!(libs::classify_cuda(46).0, Class::Transient);
    assert_eq!(libs::classify_cuda(999).0, Class::Transient);
}

#[test]
fn ecc_errors_fail_and_pending_pages_warn() {
    let gpu = |i, ecc, pending| Gpu {
        index: i,
        uuid: format!("GPU-{i}"),
        name: "A100".into(),
        driver_version: "535".into(),
        memory_total_mib: Some(1),
        memory_used_mib: Some(0),
        ecc_uncorrected_volatile: ecc,
        retired_pages_pending: pending,
    };
    let c = smi::judge(&[gpu(0, Some(0), Some(false)), gpu(1, Some(5), None)]);
    assert_eq!(c.status, Status::Fail);
    assert_eq!(c.class, Some(Class::InfrastructureFatal));
    assert!(c.message.contains("gpu 1 (GPU-1): 5"), "{}", c.message);
    let c = smi::judge(&[gpu(0, None, Some(true))]);
    assert_eq!(c.status, Status::Warn);
    assert_eq!(c.class, None);
    assert_eq!(smi::judge(&[gpu(0, None, None)]).status, Status::Pass);
}

#[test]
fn device_nodes_are_checked_against_the_request() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let sig = |r: Requested| devices::check(root, r).signature;
    assert_eq!(sig(Requested::All).as_deref(), Some(devices::NOT_INJECTED));
    make_dev(root, 2, false, true);
    assert_eq!(sig(Requested::All).as_deref(), Some("nvidiactl-missing"));
    std::fs::remove_file(root.join("dev/nvidia-uvm")).unwrap();
    make_dev(root, 2, true, false);
    assert_eq!(sig(Requested::All).as_deref(), Some("nvidia-uvm-missing"));
    make_dev(root, 2, true, true);
    assert_eq!(devices::gpu_nodes(&root.join("dev")), vec![0, 1]);
    assert_eq!(devices::check(root, Requested::All).status, Status::Pass);
    assert_eq!(
        devices::check(root, Requested::Count(2)).status,
        Status::Pass
    );
    let c = devices::check(root, Requested::Count(3));
    assert_eq!(c.class, Some(Class::InfrastructureFatal));
    assert_eq!(c.signature.as_deref(), Some("gpu-count-mismatch"));
}

#[test]
fn counts_must_agree() {
    let base = Counts {
        requested: Requested::All,
        device_nodes: 4,
        nvidia_smi: Some(4),
        nvml: Some(4),
        cuda: Some(4),
        cuda_visible_devices: None,
    };
    assert_eq!(base.check().status, Status::Pass);
    let c = Counts {
        cuda: Some(3),
        ..base.clone()
    }
    .check();
    assert_eq!(c.signature.as_deref(), Some("gpu-count-mismatch"));
    assert!(c.message.contains("cuda sees 3 of 4"), "{}", c.message);
    let c = Counts {
        cuda: Some(1),
        cuda_visible_devices: Some("0".into()),
        ..base.clone()
    };
    assert_eq!(c.check().status, Status::Pass);
    let c = Counts {
        device_nodes: 3,
        ..base.clone()
    }
    .check();
    assert_eq!(c.class, Some(Class::InfrastructureFatal));
    let c = Counts {
        requested: Requested::Count(8),
        ..base.clone()
    };
    assert_eq!(c.check().status, Status::Fail);
    let c = Counts {
        nvidia_smi: None,
        nvml: None,
        cuda: None,
        ..base.clone()
    };
    assert_eq!(c.check().status, Status::Skipped);
    let c = Counts {
        nvidia_smi: Some(0),
        nvml: Some(0),
        cuda: Some(0),
        ..base
    };
    assert_eq!(c.check().signature.as_deref(), Some("no-gpus-found"));
}

fn verdict_with(checks: Vec<Check>) -> Verdict {
    let mut v = Verdict {
        version: 1,
        host: "h".into(),
        time: "t".into(),
        mode: "require".into(),
        ran: true,
        ok: true,
        class: None,
        exit_code: 0,
        signature: None,
        message: String::new(),
        requested: Requested::All,
        gpus: vec![],
        checks,
        env: BTreeMap::new(),
        elapsed_ms: 0,
    };
    conclude(&mut v);
    v
}

#[test]
fn the_most_severe_class_wins_and_the_earliest_among_equals() {
    let v = verdict_with(vec![
        Check::fail("a", Class::Configuration, "cfg", "m"),
        Check::fail("b", Class::Transient, "t1", "m"),
        Check::fail("c", Class::Transient, "t2", "m"),
    ]);
    assert_eq!(
        (v.class, v.exit_code, v.signature.as_deref()),
        (Some(Class::Transient), 75, Some("t1"))
    );
    let v = verdict_with(vec![
        Check::fail("a", Class::Transient, "t", "m"),
        Check::fail("b", Class::InfrastructureFatal, "i", "m"),
    ]);
    assert_eq!(v.exit_code, 69);
    let v = verdict_with(vec![
        Check::pass("a", "m"),
        Check::finding("b", Status::Fixed, "fixed-thing", "m"),
    ]);
    assert!(v.ok);
    assert_eq!(v.exit_code, 0);
    assert!(v.message.contains("fixed-thing"), "{}", v.message);
}

#[test]
fn a_container_without_gpu_devices_is_configuration_even_if_everything_else_fails() {
    let v = verdict_with(vec![
        Check::fail(
            devices::NAME,
            Class::Configuration,
            devices::NOT_INJECTED,
            "m",
        ),
        Check::fail(
            "libcuda",
            Class::InfrastructureFatal,
            "libcuda-not-loadable",
            "m",
        ),
    ]);
    assert_eq!(v.exit_code, 78);
    assert_eq!(v.signature.as_deref(), Some(devices::NOT_INJECTED));
}

#[test]
fn failure_display_is_one_line_with_class_and_exit_code() {
    let v = verdict_with(vec![Check::fail(
        "nvidia-smi",
        Class::InfrastructureFatal,
        "gpu-lost",
        "line one\nline two",
    )]);
    let f = PreflightFailure {
        verdict: Box::new(v),
    };
    assert_eq!(f.exit_code(), 69);
    assert_eq!(f.class(), Class::InfrastructureFatal);
    let s = f.to_string();
    assert_eq!(
        s,
        "gpu preflight failed: infrastructure-fatal (exit 69): gpu-lost: nvidia-smi: line one line two"
    );
}

#[test]
fn verdict_is_written_atomically_and_replaced() {
    let d = tempfile::tempdir().unwrap();
    let mut v = verdict_with(vec![Check::pass("a", "m")]);
    let p = write_verdict(d.path(), &v).unwrap();
    assert_eq!(p, d.path().join("preflight/h.json"));
    v.message = "second".into();
    write_verdict(d.path(), &v).unwrap();
    let back: Verdict = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    assert_eq!(back, v);
    assert_eq!(
        std::fs::read_dir(d.path().join("preflight"))
            .unwrap()
            .count(),
        1
    );
}

#[test]
fn triton_fix_links_the_loaded_library_and_is_idempotent() {
    let d = tempfile::tempdir().unwrap();
    let lib = d.path().join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join("libcuda.so.535.1"), "elf").unwrap();
    std::os::unix::fs::symlink("libcuda.so.535.1", lib.join("libcuda.so.1")).unwrap();
    let fix = d.path().join("state/libcuda");
    let c = triton::check(&lib.join("libcuda.so.1"), None, &fix);
    assert_eq!(c.status, Status::Fixed, "{c:?}");
    let real = lib.join("libcuda.so.535.1").canonicalize().unwrap();
    assert_eq!(std::fs::read_link(fix.join("libcuda.so")).unwrap(), real);
    assert_eq!(std::fs::read_link(fix.join("libcuda.so.1")).unwrap(), real);
    assert_eq!(
        triton::check(&lib.join("libcuda.so.1"), None, &fix).status,
        Status::Fixed
    );
    // A TRITON_LIBCUDA_PATH that already works is left alone.
    assert_eq!(
        triton::check(&lib.join("libcuda.so.1"), Some(&fix), &fix).status,
        Status::Pass
    );
    // One that does not work is replaced by the fix.
    assert_eq!(
        triton::check(&lib.join("libcuda.so.1"), Some(&lib), &fix).status,
        Status::Fixed
    );
    // With the unversioned link next to the soname, nothing to do.
    std::os::unix::fs::symlink("libcuda.so.1", lib.join("libcuda.so")).unwrap();
    let other = d.path().join("other");
    assert_eq!(
        triton::check(&lib.join("libcuda.so.1"), None, &other).status,
        Status::Pass
    );
    assert!(!other.exists());
}

#[test]
fn skip_mode_and_auto_without_gpus_do_not_run_checks() {
    argus_supervise::reaper::init_in_test().unwrap();
    let d = tempfile::tempdir().unwrap();
    let o = opts(d.path(), PreflightMode::Skip);
    let out = gate_with(&o, &Stop::new()).unwrap();
    assert!(!out.verdict.ran && out.verdict.checks.is_empty() && out.env.is_empty());
    assert!(d
        .path()
        .join("logs/preflight")
        .join(format!("{}.json", host_name()))
        .exists());
    let o = opts(d.path(), PreflightMode::Auto);
    assert!(!o.gpus_expected());
    assert!(!gate_with(&o, &Stop::new()).unwrap().verdict.ran);
    make_dev(&d.path().join("root"), 1, true, true);
    assert!(o.gpus_expected());
    let o = PreflightOptions {
        visible_devices: Some("all".into()),
        ..opts(&d.path().join("elsewhere"), PreflightMode::Auto)
    };
    assert!(o.gpus_expected());
}

#[test]
fn require_mode_on_a_node_without_gpus_fails_with_a_configuration_error() {
    argus_supervise::reaper::init_in_test().unwrap();
    let d = tempfile::tempdir().unwrap();
    let Err(GateError::Failed(f)) =
        gate_with(&opts(d.path(), PreflightMode::Require), &Stop::new())
    else {
        panic!("expected a failed preflight");
    };
    assert_eq!(f.exit_code(), 78, "{f}");
    assert_eq!(f.verdict.checks.len(), 6);
    assert_eq!(
        f.verdict.checks[1].signature.as_deref(),
        Some("nvidia-smi-not-found")
    );
    let written: Verdict = serde_json::from_slice(
        &std::fs::read(
            d.path()
                .join("logs/preflight")
                .join(format!("{}.json", host_name())),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(written, *f.verdict);
}

#[test]
fn options_of_the_node_path_probe_libraries_in_a_child() {
    let cfg = argus_config::Config::from_lookup(|k| (k == "ARGUS_ROLE").then(|| "worker".into()))
        .unwrap();
    let o = PreflightOptions::from_config(&cfg);
    assert!(matches!(o.lib_probe, LibProbe::Exec(_)));
    assert_eq!(o.fix_dir, PathBuf::from("/run/argus/libcuda"));
}

#[test]
fn status_names_are_those_of_the_verdict_json() {
    for s in [
        Status::Pass,
        Status::Warn,
        Status::Fixed,
        Status::Fail,
        Status::Skipped,
    ] {
        assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
    }
}

/// Regression: on a loaded machine the library probe printed its whole
/// report and was still exiting at a 1 s timeout; the inits had returned,
/// so the report is the answer, not "did not return" (preflight's
/// nvidia_smi_hang test failed so in a cold CI run). A probe that printed
/// nothing whole is still a timeout.
#[test]
fn a_library_probe_that_answered_and_lingered_is_judged_on_its_report() {
    use std::os::unix::fs::PermissionsExt;
    argus_supervise::reaper::init_in_test().unwrap();
    let d = tempfile::tempdir().unwrap();
    let report = libs::LibReport {
        nvml: Check::pass(libs::NVML, "nvmlInit_v2 ok, 1 device(s)"),
        cuda: Check::pass(libs::CUDA, "cuInit ok, 1 device(s)"),
        nvml_count: Some(1),
        cuda_count: Some(1),
        libcuda_path: None,
    };
    let probe = |name: &str, out: &str| {
        let p = d.path().join(name);
        std::fs::write(
            &p,
            format!("#!/bin/sh\nprintf '%s' '{out}'\nexec sleep 30\n"),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        LibProbe::Exec(p)
    };
    let whole = serde_json::to_string(&report).unwrap();
    let t = Instant::now();
    let got = libs::run(
        &probe("answered", &whole),
        Duration::from_millis(500),
        &Stop::new(),
    );
    assert_eq!(got, report);
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "the lingering probe was not killed"
    );
    let half = &whole[..whole.len() / 2];
    let got = libs::run(
        &probe("cut", half),
        Duration::from_millis(500),
        &Stop::new(),
    );
    assert_eq!(got.cuda.signature.as_deref(), Some("library-init-timeout"));
    assert_eq!(got.nvml.signature.as_deref(), Some("library-init-timeout"));
}
