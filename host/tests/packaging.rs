//! The packaging files (packaging/) against what they describe: the Kubernetes manifests pass the
//! Kubernetes schemas (`kubernetes-validate --strict`, from scripts/python-test-deps) and wire
//! probes, metrics, resources and the model volume to the server; the inference-gateway example
//! (packaging/k8s/inference-gateway/) passes the schemas of the kinds the validator knows, carries
//! what its CRD kinds need, selects the server's pods and port, and points the endpoint picker at
//! gauges the server serves; the systemd unit's command line
//! with the default config serves `/health` on loopback; completions and man pages come from the
//! CLI definition.

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `.yaml` files directly in a directory of the repository, sorted.
fn yaml_files(dir: &str) -> Vec<PathBuf> {
    let dir = repo_root().join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// The Kubernetes manifests, sorted.
fn k8s_manifests() -> Vec<PathBuf> {
    let files = yaml_files("packaging/k8s");
    assert!(files.len() >= 4, "expected the k8s manifests in packaging/k8s");
    files
}

/// The inference-gateway example's manifests, sorted.
fn gateway_manifests() -> Vec<PathBuf> {
    let files = yaml_files("packaging/k8s/inference-gateway");
    assert!(
        files.len() >= 3,
        "expected the InferencePool, endpoint picker and gateway manifests in packaging/k8s/inference-gateway"
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

/// Every document of YAML files, as JSON (PyYAML from the test venv).
fn yaml_documents(files: &[PathBuf]) -> Vec<Value> {
    let out = Command::new(client_python())
        .args([
            "-c",
            "import json, sys, yaml\nprint(json.dumps([d for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d]))",
        ])
        .args(files)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every document of the manifests, as JSON.
fn k8s_documents() -> Vec<Value> {
    yaml_documents(&k8s_manifests())
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

/// The kinds of the inference-gateway example that come from CRDs (the Gateway API and its
/// Inference Extension), which `kubernetes-validate` has no schema for.
const GATEWAY_CRD_KINDS: [(&str, &str); 3] = [
    ("inference.networking.k8s.io/v1", "InferencePool"),
    ("gateway.networking.k8s.io/v1", "Gateway"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"),
];

#[test]
fn inference_gateway_manifests_pass_the_schemas_the_validator_has_and_name_their_crd_objects() {
    let files = gateway_manifests();
    let out = kubernetes_validate(&files);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubernetes-validate failed:\n{text}");

    // Every document of a kind Kubernetes defines passed its schema; only the CRD kinds went
    // without one (a misspelt apiVersion of a core kind would land here too, and fail).
    let docs = yaml_documents(&files);
    for d in &docs {
        let (api, kind, name) = (
            d["apiVersion"].as_str().unwrap_or_default(),
            d["kind"].as_str().unwrap_or_default(),
            d["metadata"]["name"].as_str().unwrap_or_default(),
        );
        assert!(
            !api.is_empty() && !kind.is_empty() && !name.is_empty(),
            "apiVersion, kind and metadata.name: {d}"
        );
        if GATEWAY_CRD_KINDS.contains(&(api, kind)) {
            assert!(
                text.contains(&format!("schema for kind {kind} with api version {api}")),
                "{kind} {name}:\n{text}"
            );
        } else {
            let resource = format!("passed for resource {}/{name}", kind.to_lowercase());
            assert!(text.contains(&resource), "{kind} {name} not validated:\n{text}");
        }
    }
    for line in text.lines().filter(|l| l.contains("Couldn't find schema")) {
        assert!(
            GATEWAY_CRD_KINDS
                .iter()
                .any(|(api, kind)| line.contains(&format!("kind {kind} with api version {api} "))),
            "a kind without a schema that is not one of the example's CRD kinds: {line}"
        );
    }
    for (_, kind) in GATEWAY_CRD_KINDS {
        doc(&docs, kind);
    }

    // The validator bites on the picker's manifest too.
    let tmp = tempfile::tempdir().unwrap();
    let epp = std::fs::read_to_string(repo_root().join("packaging/k8s/inference-gateway/epp.yaml")).unwrap();
    for (from, to) in [
        ("serviceAccountName:", "serviceAcountName:"),
        ("containerPort: 9002", "containerPort: grpc"),
    ] {
        assert!(epp.contains(from));
        let bad = tmp.path().join("epp.yaml");
        std::fs::write(&bad, epp.replacen(from, to, 1)).unwrap();
        let out = kubernetes_validate(&[bad]);
        assert!(!out.status.success(), "kubernetes-validate accepted `{to}`");
    }
}

/// A YAML text as JSON (PyYAML from the test venv).
fn yaml_text_document(text: &str) -> Value {
    use std::io::Write;
    let mut child = Command::new(client_python())
        .args([
            "-c",
            "import json, sys, yaml\nprint(json.dumps(yaml.safe_load(sys.stdin)))",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Whether every label a selector asks for is on the pod.
fn selects(selector: &Value, pod_labels: &Value) -> bool {
    selector
        .as_object()
        .unwrap()
        .iter()
        .all(|(k, v)| pod_labels.get(k) == Some(v))
}

/// The value of a `--name=value` argument of a container.
fn flag_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    let prefix = format!("--{name}=");
    container["args"]
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix(prefix.as_str()))
}

#[test]
fn inference_pool_selects_the_server_pods_and_the_picker_reads_the_servers_gauges() {
    let core = k8s_documents();
    let server_pod = &doc(&core, "Deployment")["spec"]["template"];
    let server_labels = &server_pod["metadata"]["labels"];
    let server_port = env_value(&server_pod["spec"]["containers"][0], "BERTH_PORT").unwrap();

    let docs = yaml_documents(&gateway_manifests());
    let pool = doc(&docs, "InferencePool");
    let pool_name = pool["metadata"]["name"].as_str().unwrap();
    let spec = &pool["spec"];

    // The pool is the server's pods (those the load balancer of service.yaml selects) on the
    // port the server listens on, which also serves the /metrics the picker scrapes.
    let selector = &spec["selector"]["matchLabels"];
    assert!(selects(selector, server_labels), "{selector} vs {server_labels}");
    assert_eq!(selector, &doc(&core, "Service")["spec"]["selector"]);
    assert_eq!(spec["targetPorts"].as_array().unwrap().len(), 1);
    assert_eq!(spec["targetPorts"][0]["number"].to_string(), server_port);

    // The pool's picker reference reaches the picker's ext_proc port, and the picker is not
    // itself a member of the pool.
    let picker = doc(&docs, "Deployment");
    let picker_pod = &picker["spec"]["template"];
    let picker_labels = &picker_pod["metadata"]["labels"];
    let epp = &picker_pod["spec"]["containers"][0];
    assert!(!selects(selector, picker_labels), "the pool selects the picker");
    let service = doc(&docs, "Service");
    assert_eq!(spec["endpointPickerRef"]["name"], service["metadata"]["name"]);
    assert!(selects(&service["spec"]["selector"], picker_labels));
    let service_port = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"] == spec["endpointPickerRef"]["port"]["number"])
        .expect("the Service has the pool's picker port");
    let container_port = epp["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == service_port["targetPort"])
        .expect("the Service's picker port targets a named container port");
    assert_eq!(
        flag_value(epp, "grpc-port"),
        Some(container_port["containerPort"].to_string().as_str())
    );
    assert_eq!(flag_value(epp, "pool-name"), Some(pool_name));
    assert_eq!(
        picker_pod["spec"]["serviceAccountName"],
        doc(&docs, "ServiceAccount")["metadata"]["name"]
    );
    assert_eq!(
        doc(&docs, "RoleBinding")["roleRef"]["name"],
        doc(&docs, "Role")["metadata"]["name"]
    );

    // The picker's configuration file is the ConfigMap's, mounted where --config-file points.
    let config_file = Path::new(flag_value(epp, "config-file").expect("--config-file"));
    let mount = epp["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| Path::new(m["mountPath"].as_str().unwrap()) == config_file.parent().unwrap())
        .expect("the config file's directory is mounted");
    let volume = picker_pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    let config_map = doc(&docs, "ConfigMap");
    assert_eq!(volume["configMap"]["name"], config_map["metadata"]["name"]);
    let key = config_file.file_name().unwrap().to_str().unwrap();
    let config = yaml_text_document(config_map["data"][key].as_str().expect("the config file"));
    assert_eq!(config["kind"], "EndpointPickerConfig");

    // Its plugins are named by their type unless named otherwise; every reference resolves.
    let plugins = config["plugins"].as_array().unwrap();
    let plugin = |name: &str| {
        plugins
            .iter()
            .find(|p| p["name"].as_str().or(p["type"].as_str()) == Some(name))
            .unwrap_or_else(|| panic!("no plugin {name} in the picker's config"))
    };
    for profile in config["schedulingProfiles"].as_array().unwrap() {
        for p in profile["plugins"].as_array().unwrap() {
            plugin(p["pluginRef"].as_str().unwrap());
        }
    }
    let source = &config["dataLayer"]["sources"][0];
    assert_eq!(
        plugin(source["pluginRef"].as_str().unwrap())["type"],
        "metrics-data-source"
    );
    let extractor = plugin(source["extractors"][0]["pluginRef"].as_str().unwrap());
    assert_eq!(extractor["type"], "core-metrics-extractor");
    plugin("prefix-cache-scorer");

    // The engine the picker applies to the pool's pods (they carry no engine-type label) reads
    // the model-server protocol's three gauges from Berth's names, which docs/metrics.md lists
    // and the server serves as gauges.
    let parameters = &extractor["parameters"];
    let engine = parameters["engineConfigs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == parameters["defaultEngine"])
        .expect("the default engine's metric names");
    let label = parameters["engineLabelKey"]
        .as_str()
        .unwrap_or("inference.networking.k8s.io/engine-type");
    assert!(server_labels.get(label).is_none());
    let gauges = [
        ("queuedRequestsSpec", "berth_queue_depth"),
        ("runningRequestsSpec", "berth_active_sequences"),
        ("kvUsageSpec", "berth_kv_cache_usage_ratio"),
    ];
    for (field, name) in gauges {
        assert_eq!(engine[field], name, "{field}");
    }
    assert_eq!(engine["loraSpec"], "", "Berth has no LoRA metric");
    let metrics_doc = std::fs::read_to_string(repo_root().join("docs/metrics.md")).unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = TestServer::start(home.path(), &[]);
    let (status, metrics) = server.http("GET", "/metrics", None);
    assert_eq!(status, 200);
    for (_, name) in gauges {
        assert!(
            metrics.lines().any(|l| l == format!("# TYPE {name} gauge")),
            "{name} is not a gauge of /metrics:\n{metrics}"
        );
        assert!(
            metrics_doc.contains(&format!("`{name}`")),
            "docs/metrics.md lacks {name}"
        );
    }

    // The route sends the Gateway's requests to the pool.
    let gateway = doc(&docs, "Gateway");
    let route = &doc(&docs, "HTTPRoute")["spec"];
    assert_eq!(route["parentRefs"][0]["kind"], "Gateway");
    assert_eq!(route["parentRefs"][0]["name"], gateway["metadata"]["name"]);
    let backend = &route["rules"][0]["backendRefs"][0];
    assert_eq!(backend["kind"], "InferencePool");
    assert_eq!(backend["name"], pool_name);
    assert_eq!(
        Some(backend["group"].as_str().unwrap()),
        pool["apiVersion"].as_str().unwrap().split('/').next()
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
