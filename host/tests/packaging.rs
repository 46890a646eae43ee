//! The packaging files (packaging/) against what they describe: the Kubernetes manifests pass the
//! Kubernetes schemas (`kubernetes-validate --strict`, from scripts/python-test-deps) and wire
//! probes, metrics, resources and the model volume to the server; the systemd unit's command line
//! with the default config serves `/health` on loopback; completions and man pages come from the
//! CLI definition.

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The Kubernetes manifests, sorted.
fn k8s_manifests() -> Vec<PathBuf> {
    let dir = repo_root().join("packaging/k8s");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 4,
        "expected the k8s manifests in {}",
        dir.display()
    );
    files
}

/// Runs `kubernetes-validate --strict` (the test venv's) on files.
fn kubernetes_validate(files: &[PathBuf]) -> Output {
    let venv_bin = client_python().parent().unwrap().to_path_buf();
    Command::new(venv_bin.join("kubernetes-validate"))
        .arg("--strict")
        .args(files)
        .output()
        .expect("kubernetes-validate runs (scripts/python-test-deps installs it)")
}

#[test]
fn k8s_manifests_pass_the_kubernetes_schemas_and_a_broken_one_does_not() {
    let files = k8s_manifests();
    let out = kubernetes_validate(&files);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubernetes-validate failed:\n{text}");
    for f in &files {
        let name = f.file_name().unwrap().to_str().unwrap();
        assert!(
            text.contains(&format!("{name} passed")),
            "{name} not validated:\n{text}"
        );
    }

    // The validator bites: a misspelt probe key and a non-integer replica count are refused.
    let tmp = tempfile::tempdir().unwrap();
    let deployment = std::fs::read_to_string(repo_root().join("packaging/k8s/deployment.yaml")).unwrap();
    for (from, to) in [
        ("readinessProbe:", "readinesProbe:"),
        ("replicas: 3", "replicas: three"),
    ] {
        assert!(deployment.contains(from));
        let bad = tmp.path().join("deployment.yaml");
        std::fs::write(&bad, deployment.replacen(from, to, 1)).unwrap();
        let out = kubernetes_validate(&[bad]);
        assert!(!out.status.success(), "kubernetes-validate accepted `{to}`");
    }
}

/// Every document of the manifests, as JSON (PyYAML from the test venv).
fn k8s_documents() -> Vec<Value> {
    let out = Command::new(client_python())
        .args([
            "-c",
            "import json, sys, yaml\nprint(json.dumps([d for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d]))",
        ])
        .args(k8s_manifests())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The one document of a kind.
fn doc<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "expected one {kind}");
    found[0]
}

/// A container's environment variable value.
fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?
        .get("value")?
        .as_str()
}

#[test]
fn k8s_deployment_probes_health_exports_metrics_and_serves_the_model_volume() {
    let docs = k8s_documents();
    let deployment = doc(&docs, "Deployment");
    let pod = &deployment["spec"]["template"];
    let container = &pod["spec"]["containers"][0];

    // The server listens on the pod's address at the port the probes, the Service and the
    // Prometheus annotations name.
    assert_eq!(env_value(container, "BERTH_HOST"), Some("0.0.0.0"));
    let port = env_value(container, "BERTH_PORT").expect("BERTH_PORT");
    let http = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "http")
        .expect("an `http` container port");
    assert_eq!(http["containerPort"].to_string(), port);
    for probe in ["readinessProbe", "livenessProbe"] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], "/health", "{probe}");
        assert_eq!(get["port"], "http", "{probe}");
    }
    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"].as_str(), Some(port));
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    let requests = &container["resources"]["requests"];
    assert!(
        requests["cpu"].is_string() && requests["memory"].is_string(),
        "{requests}"
    );

    // The model volume is the claim, mounted where BERTH_HOME points, in the server and the pull job.
    let claim = doc(&docs, "PersistentVolumeClaim")["metadata"]["name"].clone();
    for spec in [&pod["spec"], &doc(&docs, "Job")["spec"]["template"]["spec"]] {
        let c = &spec["containers"][0];
        let volume = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["persistentVolumeClaim"]["claimName"] == claim)
            .expect("a volume from the model claim");
        let mount = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == volume["name"])
            .expect("the model volume is mounted");
        assert_eq!(mount["mountPath"].as_str(), env_value(c, "BERTH_HOME"));
        assert_eq!(c["image"], container["image"]);
    }

    // The load balancer selects the pods and reaches their http port.
    let service = doc(&docs, "Service");
    assert_eq!(service["spec"]["type"], "LoadBalancer");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "http");
    let labels = pod["metadata"]["labels"].as_object().unwrap();
    for (k, v) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(labels.get(k), Some(v), "Service selector {k}");
    }
    assert_eq!(
        deployment["spec"]["selector"]["matchLabels"],
        service["spec"]["selector"]
    );
}

/// The unit file's `Key=value` lines (repeated keys in order).
fn unit_entries(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

#[test]
fn the_unit_command_line_and_default_config_serve_health_on_loopback() {
    let unit = std::fs::read_to_string(repo_root().join("packaging/systemd/berth.service")).unwrap();
    let entries = unit_entries(&unit);
    let get = |key: &str| -> Vec<&str> {
        entries
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    assert_eq!(get("User"), ["berth"]);
    let exec = get("ExecStart");
    let argv: Vec<&str> = exec[0].split_whitespace().collect();
    assert_eq!(argv[..2], ["/usr/bin/berth", "serve"], "ExecStart");

    // Run the unit's command line as the unit would: its environment (state and cache
    // directories moved into temp dirs) and arguments, the packaged config in place of
    // /etc/berth/berth.toml, and only `--port 0` added so the test owns its port.
    let tmp = tempfile::tempdir().unwrap();
    let config = repo_root().join("packaging/berth.toml");
    let mut cmd = Command::new(berth_exe());
    for arg in &argv[1..] {
        cmd.arg(if *arg == "/etc/berth/berth.toml" {
            config.as_os_str()
        } else {
            arg.as_ref()
        });
    }
    assert!(
        argv.contains(&"/etc/berth/berth.toml"),
        "ExecStart names the config"
    );
    cmd.arg("--port").arg("0");
    for var in [
        "BERTH_HOST",
        "BERTH_PORT",
        "BERTH_API_KEY",
        "BERTH_CONFIG",
        "BERTH_PLUGIN_PATH",
    ] {
        cmd.env_remove(var);
    }
    for assignment in get("Environment") {
        let (name, value) = assignment.split_once('=').unwrap();
        let value = if value.starts_with("/var/") {
            let dir = tmp.path().join(value.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).unwrap();
            dir
        } else {
            PathBuf::from(value)
        };
        cmd.env(name, value);
    }
    let (mut child, address, port) = spawn_serve(&mut cmd);
    let health = http_request(port, "GET", "/health", "");
    let metrics = http_request(port, "GET", "/metrics", "");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        address.starts_with("http://127.0.0.1:"),
        "the default config listens on loopback, not {address}"
    );
    assert_eq!(health.0, 200, "{}", health.1);
    assert_eq!(serde_json::from_str::<Value>(&health.1).unwrap()["status"], "ok");
    assert_eq!(metrics.0, 200);
}

#[test]
fn completions_and_man_pages_are_generated_from_the_cli() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let bash = berth_ok(home, None, &["completions", "bash"]);
    for word in ["serve", "pull", "catalog", "completions", "--api-key"] {
        assert!(bash.contains(word), "bash completion lacks {word}");
    }
    assert!(berth_ok(home, None, &["completions", "zsh"]).starts_with("#compdef berth"));
    assert!(berth_ok(home, None, &["completions", "fish"]).contains("complete -c berth"));
    let bad = berth(home, None, &["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("tcsh"));

    let page = berth_ok(home, None, &["man"]);
    assert!(page.contains("\n.TH berth 1 "), "{page}");
    assert!(
        page.contains("\nberth\\-serve(1)\n"),
        "the page lists the commands' pages:\n{page}"
    );
    let dir = home.join("man");
    berth_ok(home, None, &["man", "--dir", dir.to_str().unwrap()]);
    let serve_page = std::fs::read_to_string(Path::new(&dir).join("berth-serve.1")).unwrap();
    assert!(serve_page.contains("\n.TH berth-serve 1 "), "{serve_page}");
    assert!(serve_page.contains("\\fB\\-\\-api\\-key\\fR"), "{serve_page}");
    assert!(dir.join("berth.1").is_file() && dir.join("berth-pull.1").is_file());
}
