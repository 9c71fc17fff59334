//! The official Gateway API conformance suite (sigs.k8s.io/gateway-api v1.6.3, its Go test
//! `TestConformance`) against veloxy as the Gateway controller (issue 37), through
//! `dev/gateway-conformance.sh`: a real etcd, kube-apiserver and kube-controller-manager, the
//! suite's echo-basic backends run by `dev/kube/kubelet-standin`, and this build's veloxy, all
//! in a network namespace of the script's own. The core features (Gateway, HTTPRoute,
//! ReferenceGrant) are given; the test asserts a floor of passing tests ([`FLOOR`]; all 36
//! that run pass as of this writing: the table is in
//! bench/results/gateway-conformance-20261127c) and names the failures. About 30 s when all
//! pass (a failing test waits for the suite's timeouts).
//!
//! Skipped without the binaries (`bash .ci/kube.sh` and `bash .ci/conformance.sh` build them
//! into ~/.cache/veloxy/bin) or without `unshare -n` rights.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use veloxy_testkit::kube::kube_bin;
use veloxy_testkit::*;

/// All 36 core tests pass today (34 before the `*` certificate of a hostname-less HTTPS
/// listener and `gateway_addresses`); the floor is one below, so that a miss of the
/// statistical HTTPRouteWeight alone does not fail CI. Fewer is a regression.
const FLOOR: usize = 35;

#[test]
fn gateway_api_conformance_core_tests_pass() {
    let bins = [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "echo-basic",
        "gateway-conformance.test",
        "kubelet-standin",
    ];
    // A binary counts once its stamp is written (after its build): `.ci/run` may still be
    // building them in the background.
    let stamped = |b: &&str| kube_bin(b).exists() && kube_bin(&format!("{b}.stamp")).exists();
    if let Some(b) = bins.iter().find(|b| !stamped(b)) {
        skip(&format!(
            "no {} (run `bash .ci/kube.sh` and `bash .ci/conformance.sh`)",
            kube_bin(b).display()
        ));
        return;
    }
    if !Command::new("unshare")
        .args(["-n", "true"])
        .status()
        .is_ok_and(|s| s.success())
    {
        skip("unshare -n is not permitted here (needs root)");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // The table and the suite's output (.log beside it) stay for a look after the run.
    let table = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gateway-conformance.md");
    let started = Instant::now();
    // The suite's own deadline (the last -test.timeout wins) bounds the run; the script's
    // start-up waits are bounded too (dev/kube/start.sh: 90 s).
    let out = Command::new("bash")
        .arg(root.join("dev/gateway-conformance.sh"))
        .arg("--veloxy")
        .arg(format!("{VELOXY}"))
        .arg("--out")
        .arg(&table)
        .args(["--", "-test.timeout=12m"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the harness failed:\n{stdout}\n{stderr}"
    );
    let text = std::fs::read_to_string(&table).unwrap_or_default();
    eprintln!(
        "{text}\nsuite and set-up: {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let rows = |what: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.split('|').nth(2).map(str::trim) == Some(what))
            .map(|l| l.split('|').nth(1).unwrap_or("").trim().to_string())
            .collect()
    };
    let (passed, failed) = (rows("pass"), rows("fail"));
    assert!(
        passed.len() >= FLOOR,
        "{} core conformance tests passed, fewer than {FLOOR}; failed: {failed:?}\n\
         suite output: {}",
        passed.len(),
        table.with_extension("log").display()
    );
}
