//! Test helpers: chunk wheels and a fake PyPI index, plus the GGUF and safetensors writers from
//! `berth-formats` (public with the `testutil` feature, for the host's end-to-end tests).

pub use berth_formats::testutil::{file_tree, safetensors_bytes, sample_gguf, GgufWriter};

/// A wheel (zip) for `module` holding one data file, `<module>-1.0.data/data/chunk`.
pub fn wheel_bytes(module: &str, data: &[u8], deflate: bool) -> Vec<u8> {
    use std::io::Write;
    let method = if deflate {
        zip::CompressionMethod::Deflated
    } else {
        zip::CompressionMethod::Stored
    };
    let opts = zip::write::SimpleFileOptions::default().compression_method(method);
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    zip.start_file(format!("{module}/__init__.py"), opts).unwrap();
    zip.start_file(format!("{module}-1.0.data/data/chunk"), opts)
        .unwrap();
    zip.write_all(data).unwrap();
    zip.start_file(format!("{module}-1.0.dist-info/METADATA"), opts)
        .unwrap();
    zip.finish().unwrap().into_inner()
}

/// A wheel laid out as a plain package: the data file `<module>/chunk.bin` beside the package's
/// `__init__.py` (no `.data` folder), as the EmbeddingGemma chunk wheels are.
pub fn package_wheel_bytes(module: &str, version: &str, data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    zip.start_file(format!("{module}/__init__.py"), opts).unwrap();
    zip.write_all(b"# chunk\n").unwrap();
    zip.start_file(format!("{module}/chunk.bin"), opts).unwrap();
    zip.write_all(data).unwrap();
    for meta in ["METADATA", "WHEEL", "top_level.txt", "RECORD"] {
        zip.start_file(format!("{module}-{version}.dist-info/{meta}"), opts)
            .unwrap();
    }
    zip.finish().unwrap().into_inner()
}

/// The lowercase hex sha256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A PyPI-shaped index on loopback: `/pypi/<package>/json` and `/files/<wheel>`.
pub struct FakeIndex {
    /// The base URL, `http://127.0.0.1:<port>`.
    pub url: String,
    /// Wheel downloads served so far.
    pub downloads: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// One release the fake index serves: package, version, wheel bytes, the sha256 it advertises.
pub struct FakeRelease {
    /// The PyPI package name.
    pub package: String,
    /// The version.
    pub version: String,
    /// The wheel's bytes.
    pub wheel: Vec<u8>,
    /// The sha256 the JSON advertises (normally the wheel's).
    pub sha256: String,
}

impl FakeRelease {
    /// A release whose wheel holds `data` and whose JSON gives its true sha256.
    pub fn new(package: &str, version: &str, data: &[u8]) -> FakeRelease {
        let wheel = wheel_bytes(&package.replace('-', "_"), data, true);
        let sha256 = sha256_hex(&wheel);
        FakeRelease {
            package: package.into(),
            version: version.into(),
            wheel,
            sha256,
        }
    }

    /// A release whose wheel is a plain package holding `data` beside `__init__.py`.
    pub fn package_layout(package: &str, version: &str, data: &[u8]) -> FakeRelease {
        let wheel = package_wheel_bytes(&package.replace('-', "_"), version, data);
        let sha256 = sha256_hex(&wheel);
        FakeRelease {
            package: package.into(),
            version: version.into(),
            wheel,
            sha256,
        }
    }

    /// The JSON API's file list for this release: its one wheel.
    fn files_json(&self) -> serde_json::Value {
        serde_json::json!([{
            "filename": self.filename(),
            "url": format!("/files/{}", self.filename()),
            "size": self.wheel.len(),
            "packagetype": "bdist_wheel",
            "digests": {"sha256": self.sha256},
        }])
    }

    /// The wheel's file name.
    pub fn filename(&self) -> String {
        format!(
            "{}-{}-py3-none-any.whl",
            self.package.replace('-', "_"),
            self.version
        )
    }
}

impl FakeIndex {
    /// Serves the releases on a background thread until the process ends; several releases of
    /// one package share its `/pypi/<package>/json` answer, the last one being the latest.
    pub fn start(releases: Vec<FakeRelease>) -> FakeIndex {
        use std::io::{BufRead, BufReader, Write};
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let downloads = Arc::new(AtomicUsize::new(0));
        let counter = downloads.clone();
        let releases = Arc::new(releases);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let releases = releases.clone();
                let counter = counter.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(conn.try_clone().unwrap());
                    let mut line = String::new();
                    let _ = reader.read_line(&mut line);
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                            break;
                        }
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                    let found = releases.iter().find_map(|r| {
                        if path == format!("/pypi/{}/json", r.package) {
                            let all: Vec<&FakeRelease> =
                                releases.iter().filter(|o| o.package == r.package).collect();
                            let latest = all.last().copied().unwrap_or(r);
                            let by_version: serde_json::Map<String, serde_json::Value> =
                                all.iter().map(|o| (o.version.clone(), o.files_json())).collect();
                            let json = serde_json::json!({
                                "info": {"version": latest.version},
                                "releases": by_version,
                                "urls": latest.files_json(),
                            });
                            Some(json.to_string().into_bytes())
                        } else if path == format!("/files/{}", r.filename()) {
                            counter.fetch_add(1, Ordering::SeqCst);
                            Some(r.wheel.clone())
                        } else {
                            None
                        }
                    });
                    let (status, body) = match found {
                        Some(b) => ("200 OK", b),
                        None => ("404 Not Found", b"not found".to_vec()),
                    };
                    let _ = write!(
                        conn,
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(&body);
                });
            }
        });
        FakeIndex { url, downloads }
    }
}

/// A catalog with one pack `name` made of the given parts, for a file of `data`.
pub fn catalog_toml(name: &str, family: &str, parts: &[(&str, &str)], data: &[u8]) -> String {
    let parts: Vec<String> = parts
        .iter()
        .map(|(p, v)| format!("{{ package = \"{p}\", version = \"{v}\" }}"))
        .collect();
    format!(
        "[[pack]]\nname = \"{name}\"\nfamily = \"{family}\"\nfile = \"{}.gguf\"\nsize = {}\nsha256 = \"{}\"\nparts = [{}]\n",
        name.replace([':', '/'], "-"),
        data.len(),
        sha256_hex(data),
        parts.join(", ")
    )
}
