//! Image inputs of a request: OpenAI `image_url` parts (`data:` URLs and `http(s)` URLs) and
//! Ollama `images`, loaded, decoded, prepared by the model itself (its plugin's `prepare_image`:
//! resize, slices, normalisation, placeholder text), their placeholder text put where the image
//! was in the message, and their slices matched to the placeholder tokens of the tokenized
//! prompt. Every failure is a 400 naming the part.
//!
//! While the conversation is rendered, each image stands in its message's content as a marker
//! ([`marker`]); the rendered text then gets each image's placeholder in place of its marker, as a
//! model's own processor expands the image token the template wrote.

use super::request::{ImageRef, ImageSource};
use super::ApiError;
use crate::engine::{JobImage, SubmitError};
use crate::image::{DecodeLimits, RgbImage};
use crate::state::models::Model;
use crate::tokenizer::Tokenizer;
use axum::http::StatusCode;
use base64::Engine as _;
use berth_plugin_api::{ErrorKind, PluginError, PreparedImage, VisionSpec};
use serde_json::Value;
use sha2::Digest;
use std::io::Read;
use std::time::Duration;

/// The largest image accepted, in bytes (after base64 decoding, or as fetched).
pub const MAX_IMAGE_BYTES: usize = 20 << 20;
/// How long fetching an `http(s)` image may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// One image of a request, with where it was.
#[derive(Debug, Clone)]
pub struct RequestImage {
    /// Where it was, for errors (`messages[1].content[2]`, `images[0]`).
    pub place: String,
    /// Its bytes (any accepted format).
    pub bytes: Vec<u8>,
}

/// The marker standing for image `k` in rendered text (noncharacters that no client text has).
pub fn marker(k: usize) -> String {
    format!("\u{FDD0}berth-image-{k}\u{FDD1}")
}

fn bad(place: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::param(place, format!("{place}: {message}"))
}

/// Decodes the standard (or URL-safe) base64 of an image.
fn base64_bytes(place: &str, text: &str) -> Result<Vec<u8>, ApiError> {
    let clean: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    if clean.len() / 4 * 3 > MAX_IMAGE_BYTES + 3 {
        return Err(bad(
            place,
            format!("image too large: more than {MAX_IMAGE_BYTES} bytes"),
        ));
    }
    base64::engine::general_purpose::STANDARD
        .decode(&clean)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(&clean))
        .map_err(|e| bad(place, format!("the image is not valid base64: {e}")))
}

/// Which addresses an `http(s)` image URL may make the server connect to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UrlPolicy {
    /// Also loopback, private, link-local and other non-public addresses
    /// (`berth serve --allow-private-image-urls`); off by default, so a request cannot turn the
    /// server into a proxy into its own network.
    pub allow_private: bool,
}

/// Whether `ip` is an address a request's image URL may not reach by default: loopback,
/// private (RFC 1918, unique-local), link-local (cloud metadata lives at 169.254.169.254),
/// shared (100.64/10), unspecified, multicast, broadcast, benchmarking and reserved ranges, and
/// the IPv4-mapped and NAT64 forms of those in IPv6.
pub fn is_private(ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 198 && (18..20).contains(&b))
                || a >= 240
        }
        IpAddr::V6(v6) => {
            let seg = v6.segments();
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_private(IpAddr::V4(v4));
            }
            if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let o = v6.octets();
                return is_private(IpAddr::V4(std::net::Ipv4Addr::new(o[12], o[13], o[14], o[15])));
            }
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (seg[0] & 0xfe00) == 0xfc00
                || (seg[0] & 0xffc0) == 0xfe80
        }
    }
}

/// The IP address a URL names literally (`http://127.0.0.1/`, `http://[::1]/`), if it does.
fn literal_ip(url: &reqwest::Url) -> Option<std::net::IpAddr> {
    let host = url.host_str()?;
    host.trim_start_matches('[').trim_end_matches(']').parse().ok()
}

/// Resolves names for image fetches, keeping only the addresses the policy allows, so neither
/// the first request nor a redirect, nor a name that resolves differently on the second lookup,
/// can reach a private address.
struct GuardedResolver;

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found = tokio::task::spawn_blocking(move || {
                std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), 0))
                    .map(|a| (host, a.collect::<Vec<_>>()))
            })
            .await
            .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)?;
            let (host, addrs) = found.map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)?;
            let public: Vec<std::net::SocketAddr> =
                addrs.iter().copied().filter(|a| !is_private(a.ip())).collect();
            if public.is_empty() {
                let shown = addrs
                    .first()
                    .map_or_else(|| "nothing".to_string(), |a| a.ip().to_string());
                return Err(format!(
                    "{host} resolves to a private address ({shown}); \
                     `berth serve --allow-private-image-urls` allows such image URLs"
                )
                .into());
            }
            Ok(Box::new(public.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Why the policy refuses `url`, if it names a private address literally.
fn refused(url: &reqwest::Url, policy: UrlPolicy) -> Option<String> {
    let ip = literal_ip(url).filter(|ip| !policy.allow_private && is_private(*ip))?;
    Some(format!(
        "{ip} is a private address (loopback, private, link-local or reserved); \
         `berth serve --allow-private-image-urls` allows such image URLs"
    ))
}

/// Fetches an `http(s)` image with the size and time limits and the address policy (blocking;
/// run off the runtime). Redirects (up to 5) are checked like the first URL.
fn fetch(url: &str, policy: UrlPolicy) -> Result<Vec<u8>, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| e.to_string())?;
    if let Some(why) = refused(&parsed, policy) {
        return Err(why);
    }
    let redirects = reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= 5 {
            attempt.error("more than 5 redirects")
        } else if let Some(why) = refused(attempt.url(), policy) {
            let to = attempt.url().to_string();
            attempt.error(format!("redirected to {to}: {why}"))
        } else {
            attempt.follow()
        }
    });
    let mut builder = reqwest::blocking::Client::builder()
        .timeout(FETCH_TIMEOUT)
        .redirect(redirects);
    if !policy.allow_private {
        builder = builder.dns_resolver(std::sync::Arc::new(GuardedResolver));
    }
    let client = builder.build().map_err(|e| e.to_string())?;
    let resp = client.get(parsed).send().map_err(|e| {
        // The resolver's or the redirect check's own words, not only reqwest's outer message.
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            text = format!("{text}: {s}");
            source = s.source();
        }
        text
    })?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status()));
    }
    let mut bytes = Vec::new();
    resp.take(MAX_IMAGE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() > MAX_IMAGE_BYTES {
        return Err(format!("image too large: more than {MAX_IMAGE_BYTES} bytes"));
    }
    Ok(bytes)
}

/// The bytes an `image_url` names: a `data:` URL's payload or an `http(s)` URL's body.
async fn load_url(place: &str, url: &str, policy: UrlPolicy) -> Result<Vec<u8>, ApiError> {
    if let Some(rest) = url.strip_prefix("data:") {
        let Some((meta, payload)) = rest.split_once(',') else {
            return Err(bad(place, "the data URL has no ',' before its data"));
        };
        if !meta.ends_with(";base64") {
            return Err(bad(place, "only base64 data URLs are accepted"));
        }
        return base64_bytes(place, payload);
    }
    if url.starts_with("http://") || url.starts_with("https://") {
        let u = url.to_string();
        return match tokio::task::spawn_blocking(move || fetch(&u, policy)).await {
            Ok(Ok(bytes)) => Ok(bytes),
            Ok(Err(e)) => Err(bad(place, format!("cannot fetch the image at {url}: {e}"))),
            Err(e) => Err(bad(place, format!("cannot fetch the image at {url}: {e}"))),
        };
    }
    let shown: String = url.chars().take(40).collect();
    Err(bad(
        place,
        format!("the image URL '{shown}' is neither a data: URL nor an http(s) URL"),
    ))
}

/// The bytes of one image of a turn (fetched, or decoded from base64).
pub async fn load(image: &ImageRef, policy: UrlPolicy) -> Result<RequestImage, ApiError> {
    let place = image.place.clone();
    let bytes = match &image.source {
        ImageSource::Url(url) if url.is_empty() => return Err(bad(&place, "'image_url.url' is required")),
        ImageSource::Url(url) => load_url(&place, url, policy).await?,
        ImageSource::Base64(b) => base64_bytes(&place, b)?,
        ImageSource::Bytes(b) => b.clone(),
    };
    Ok(RequestImage { place, bytes })
}

/// Takes the `image_url` parts out of OpenAI messages: each message with images gets its parts
/// joined into one string with a [`marker`] where each image was. Returns the images in order.
pub async fn take_openai(messages: &mut [Value], policy: UrlPolicy) -> Result<Vec<RequestImage>, ApiError> {
    let mut images = Vec::new();
    for (i, m) in messages.iter_mut().enumerate() {
        let Some(Value::Array(parts)) = m.get("content") else {
            continue;
        };
        if !parts
            .iter()
            .any(|p| p.get("type").and_then(Value::as_str) == Some("image_url"))
        {
            continue;
        }
        let mut text = String::new();
        for (j, part) in parts.iter().enumerate() {
            let place = format!("messages[{i}].content[{j}]");
            match part.get("type").and_then(Value::as_str) {
                Some("text") => text.push_str(part.get("text").and_then(Value::as_str).unwrap_or("")),
                Some("image_url") => {
                    let url = match part.get("image_url") {
                        Some(Value::String(s)) => s.as_str(),
                        Some(Value::Object(o)) => o.get("url").and_then(Value::as_str).unwrap_or(""),
                        _ => "",
                    };
                    if url.is_empty() {
                        return Err(bad(&place, "'image_url.url' is required"));
                    }
                    let bytes = load_url(&place, url, policy).await?;
                    text.push_str(&marker(images.len()));
                    images.push(RequestImage { place, bytes });
                }
                _ => {}
            }
        }
        m["content"] = Value::String(text);
    }
    Ok(images)
}

/// Takes Ollama `images` (base64) out of chat messages: each message's images go before its
/// text, as Ollama puts them. Returns the images in order.
pub fn take_ollama(messages: &mut [Value]) -> Result<Vec<RequestImage>, ApiError> {
    let mut images = Vec::new();
    for (i, m) in messages.iter_mut().enumerate() {
        let Some(o) = m.as_object_mut() else { continue };
        let list = match o.remove("images") {
            None | Some(Value::Null) => continue,
            Some(Value::Array(a)) => a,
            Some(_) => {
                return Err(bad(
                    &format!("messages[{i}].images"),
                    "must be an array of base64 strings",
                ))
            }
        };
        let mut prefix = String::new();
        for (j, v) in list.iter().enumerate() {
            let place = format!("messages[{i}].images[{j}]");
            let s = v.as_str().ok_or_else(|| bad(&place, "must be a base64 string"))?;
            let bytes = base64_bytes(&place, s)?;
            prefix.push_str(&marker(images.len()));
            images.push(RequestImage { place, bytes });
        }
        let content = o.get("content").and_then(Value::as_str).unwrap_or("").to_string();
        o.insert("content".into(), Value::String(prefix + &content));
    }
    Ok(images)
}

/// Ollama `/api/generate`'s top-level `images`: the images and the markers to put before the prompt.
pub fn take_ollama_generate(list: Option<&Vec<Value>>) -> Result<(Vec<RequestImage>, String), ApiError> {
    let mut images = Vec::new();
    let mut prefix = String::new();
    for (j, v) in list.into_iter().flatten().enumerate() {
        let place = format!("images[{j}]");
        let s = v.as_str().ok_or_else(|| bad(&place, "must be a base64 string"))?;
        let bytes = base64_bytes(&place, s)?;
        prefix.push_str(&marker(images.len()));
        images.push(RequestImage { place, bytes });
    }
    Ok((images, prefix))
}

/// A 400 unless the model takes images.
pub fn check_vision<'a>(
    model: &'a Model,
    images: &[RequestImage],
) -> Result<Option<&'a VisionSpec>, ApiError> {
    vision_for(model.vision.as_ref(), &model.reference, images)
}

/// A 400 naming the first image unless there is a vision spec (`reference` names the model).
fn vision_for<'a>(
    vision: Option<&'a VisionSpec>,
    reference: &str,
    images: &[RequestImage],
) -> Result<Option<&'a VisionSpec>, ApiError> {
    match (images.first(), vision) {
        (None, _) => Ok(None),
        (Some(_), Some(v)) => Ok(Some(v)),
        (Some(img), None) => Err(bad(&img.place, format!("model {reference} does not take images"))),
    }
}

/// The model's answers for decoded images, one per image in order: its `prepare_image`
/// through the engine, or any stand-in.
pub type PrepareResult = Result<Vec<Result<PreparedImage, PluginError>>, SubmitError>;

/// An image prepared by the model, with its slices (their positions still empty) and each
/// slice's placeholder token count.
struct Prepared {
    placeholder: String,
    slices: Vec<(JobImage, usize)>,
}

/// The job slices of a prepared image; `bytes` (the file) gives their prefix-cache hashes.
fn job_slices(bytes: &[u8], prepared: PreparedImage) -> Prepared {
    let hash = {
        let d = sha2::Sha256::digest(bytes);
        u64::from_le_bytes(d[..8].try_into().expect("8 bytes"))
    };
    let slices = prepared
        .slices
        .into_iter()
        .enumerate()
        .map(|(k, s)| {
            let job = JobImage {
                shape: s.shape,
                pixels: s.pixels,
                patch_mask: s.patch_mask,
                grid: s.grid,
                positions: Vec::new(),
                hash: hash ^ (k as u64).wrapping_mul(0xff51_afd7_ed55_8ccd),
            };
            (job, s.tokens as usize)
        })
        .collect();
    Prepared {
        placeholder: prepared.placeholder,
        slices,
    }
}

/// Puts each image's placeholder text in place of its marker in the rendered prompt, tokenizes
/// it, and gives each slice the positions of its placeholder tokens. Returns the text, the
/// tokens and the slices for the engine.
pub fn expand(
    model: &Model,
    rendered: &str,
    images: &[RequestImage],
    add_special: bool,
) -> Result<(String, Vec<u32>, Vec<JobImage>), ApiError> {
    expand_for(
        &model.tokenizer,
        model.vision.as_ref(),
        &model.reference,
        rendered,
        images,
        add_special,
        |decoded| off_the_runtime(|| model.engine.prepare_images(decoded)),
    )
}

/// Runs `f`, which blocks until the engine answers (between two decode steps), without holding
/// up the other tasks of a multi-thread runtime's worker (`block_in_place`: `berth serve`); on a
/// current-thread runtime (`berth run`) or outside one, it just runs.
fn off_the_runtime<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// [`expand`] for any tokenizer, vision spec and way of preparing images (`prepare` gets each
/// decoded image with its number among the request's images); `reference` names the model in
/// errors.
pub fn expand_for(
    tokenizer: &Tokenizer,
    vision: Option<&VisionSpec>,
    reference: &str,
    rendered: &str,
    images: &[RequestImage],
    add_special: bool,
    prepare: impl FnOnce(Vec<(RgbImage, u32)>) -> PrepareResult,
) -> Result<(String, Vec<u32>, Vec<JobImage>), ApiError> {
    let Some(spec) = vision_for(vision, reference, images)? else {
        return Ok((
            rendered.to_string(),
            tokenizer.encode(rendered, add_special),
            Vec::new(),
        ));
    };
    let unusable = |e: String| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("model {reference} cannot take images: {e}"),
        )
    };
    let image_id =
        u32::try_from(spec.image_token_id).map_err(|_| unusable("negative image token id".into()))?;
    let mut decoded = Vec::with_capacity(images.len());
    for (k, img) in images.iter().enumerate() {
        if rendered.matches(&marker(k)).count() != 1 {
            return Err(bad(&img.place, "the chat template dropped or repeated the image"));
        }
        let rgb =
            crate::image::decode(&img.bytes, DecodeLimits::default()).map_err(|e| bad(&img.place, e))?;
        let index = u32::try_from(k).map_err(|_| bad(&img.place, "too many images"))?;
        decoded.push((rgb, index));
    }
    let answers = prepare(decoded).map_err(|e| match e {
        SubmitError::Closed => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("model {reference} is unloading"),
        ),
        SubmitError::QueueFull => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("model {reference} is busy"),
        ),
    })?;
    if answers.len() != images.len() {
        return Err(unusable(format!(
            "{} images prepared for {}",
            answers.len(),
            images.len()
        )));
    }
    let mut text = rendered.to_string();
    let mut prepared = Vec::with_capacity(images.len());
    for (k, (img, answer)) in images.iter().zip(answers).enumerate() {
        let p = match answer {
            Ok(p) => job_slices(&img.bytes, p),
            Err(e) if e.kind == ErrorKind::InvalidArgument => {
                return Err(bad(
                    &img.place,
                    format!("the model cannot take the image: {}", e.message),
                ))
            }
            Err(e) => {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!(
                        "{}: model {reference} failed to prepare the image: {e}",
                        img.place
                    ),
                ))
            }
        };
        text = text.replacen(&marker(k), &p.placeholder, 1);
        prepared.push(p);
    }
    let tokens = tokenizer.encode(&text, add_special);
    let mut at = tokens
        .iter()
        .enumerate()
        .filter(|&(_, &t)| t == image_id)
        .map(|(i, _)| i as i32);
    let mut out = Vec::new();
    for (img, p) in images.iter().zip(prepared) {
        for (mut job, count) in p.slices {
            job.positions = at.by_ref().take(count).collect();
            if job.positions.len() != count {
                return Err(bad(
                    &img.place,
                    "the prompt does not hold the image's placeholder tokens (does the text contain image tokens?)",
                ));
            }
            out.push(job);
        }
    }
    if at.next().is_some() {
        return Err(ApiError::param(
            "messages",
            "the prompt holds more image placeholder tokens than its images fill",
        ));
    }
    Ok((text, tokens, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_addresses_are_told_from_public_ones() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "198.18.0.1",
            "240.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "fc00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "ff02::1",
        ] {
            assert!(is_private(ip.parse().unwrap()), "{ip} should be private");
        }
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(!is_private(ip.parse().unwrap()), "{ip} should be public");
        }
    }

    #[test]
    fn literal_private_urls_are_refused_unless_allowed() {
        let deny = UrlPolicy::default();
        let allow = UrlPolicy { allow_private: true };
        for url in [
            "http://127.0.0.1:8080/x.png",
            "http://[::1]/x.png",
            "https://169.254.169.254/latest/meta-data",
        ] {
            let u = reqwest::Url::parse(url).unwrap();
            let why = refused(&u, deny).unwrap_or_else(|| panic!("{url} passed"));
            assert!(why.contains("--allow-private-image-urls"), "{why}");
            assert_eq!(refused(&u, allow), None, "{url}");
        }
        assert_eq!(
            refused(&reqwest::Url::parse("https://example.com/x.png").unwrap(), deny),
            None
        );
        // A name that resolves only to loopback is refused by the resolver, before any connection.
        let e = fetch("http://localhost:9/x.png", deny).unwrap_err();
        assert!(e.contains("private address"), "{e}");
    }

    #[test]
    fn base64_and_data_urls_decode_and_bad_ones_name_the_part() {
        assert_eq!(base64_bytes("images[0]", "aGk=\n").unwrap(), b"hi");
        let e = base64_bytes("images[1]", "not base64!").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.starts_with("images[1]: "), "{}", e.message);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let got = rt
            .block_on(load_url("p", "data:image/png;base64,aGk=", UrlPolicy::default()))
            .unwrap();
        assert_eq!(got, b"hi");
        let e = rt
            .block_on(load_url("p", "ftp://x/y.png", UrlPolicy::default()))
            .unwrap_err();
        assert!(e.message.contains("ftp://x/y.png"), "{}", e.message);
    }

    #[test]
    fn openai_parts_become_markers_in_order() {
        let mut msgs = vec![serde_json::json!({"role": "user", "content": [
            {"type": "text", "text": "a "},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}},
            {"type": "text", "text": " b"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}},
        ]})];
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let imgs = rt.block_on(take_openai(&mut msgs, UrlPolicy::default())).unwrap();
        assert_eq!(imgs.len(), 2);
        assert_eq!(imgs[1].place, "messages[0].content[3]");
        assert_eq!(msgs[0]["content"], format!("a {} b{}", marker(0), marker(1)));
    }

    /// A byte-level tokenizer whose token 256 is `<img>`.
    fn img_tokenizer() -> (tempfile::TempDir, Tokenizer) {
        let vocab: serde_json::Map<String, Value> = crate::tokenizer::byte_level_alphabet()
            .iter()
            .enumerate()
            .map(|(i, c)| (c.to_string(), serde_json::json!(i)))
            .collect();
        let bl = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false,
            "trim_offsets": true, "use_regex": true});
        let tj = serde_json::json!({"version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{"id": 256, "content": "<img>", "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null, "pre_tokenizer": bl, "post_processor": null, "decoder": bl,
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
                "byte_fallback": false, "vocab": vocab, "merges": []}});
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, tj.to_string()).unwrap();
        let tok = Tokenizer::from_tokenizer_json(&path).unwrap();
        (dir, tok)
    }

    #[test]
    fn the_models_placeholders_replace_the_markers_and_its_refusals_name_the_image() {
        let (_dir, tok) = img_tokenizer();
        let spec = VisionSpec {
            scheme: String::new(),
            layout: berth_plugin_api::PixelLayout::Chw,
            patch_size: 1,
            image_token_id: 256,
            params: Default::default(),
        };
        let png = std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/images/tiny.png"),
        )
        .unwrap();
        let images = vec![RequestImage {
            place: "images[0]".into(),
            bytes: png,
        }];
        let rendered = format!("a{}b", marker(0));
        let two = |decoded: Vec<(RgbImage, u32)>| -> PrepareResult {
            assert_eq!(decoded.len(), 1);
            assert_eq!(decoded[0].1, 0);
            Ok(vec![Ok(PreparedImage {
                placeholder: "<img><img>".into(),
                slices: vec![berth_plugin_api::PreparedSlice {
                    shape: vec![3, 1, 1],
                    pixels: vec![0.0; 3],
                    tokens: 2,
                    ..Default::default()
                }],
            })])
        };
        let (text, tokens, slices) =
            expand_for(&tok, Some(&spec), "m", &rendered, &images, false, two).unwrap();
        assert_eq!(text, "a<img><img>b");
        assert_eq!(tokens[1..3], [256, 256]);
        assert_eq!(slices.len(), 1);
        assert_eq!(slices[0].positions, vec![1, 2]);
        let refuse = |_: Vec<(RgbImage, u32)>| -> PrepareResult {
            Ok(vec![Err(PluginError::invalid_argument("too small"))])
        };
        let e = expand_for(&tok, Some(&spec), "m", &rendered, &images, false, refuse).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(
            e.message.starts_with("images[0]: ") && e.message.contains("too small"),
            "{}",
            e.message
        );
        let gone = |_: Vec<(RgbImage, u32)>| -> PrepareResult { Err(SubmitError::Closed) };
        let e = expand_for(&tok, Some(&spec), "m", &rendered, &images, false, gone).unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        // A file that does not decode is a 400 naming it before the model sees anything.
        let broken = vec![RequestImage {
            place: "images[0]".into(),
            bytes: b"not an image".to_vec(),
        }];
        let unused = |_: Vec<(RgbImage, u32)>| -> PrepareResult { panic!("nothing to prepare") };
        let e = expand_for(&tok, Some(&spec), "m", &rendered, &broken, false, unused).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.starts_with("images[0]: "), "{}", e.message);
    }

    #[test]
    fn ollama_images_go_before_the_text() {
        let mut msgs = vec![serde_json::json!({"role": "user", "content": "hi", "images": ["aGk="]})];
        let imgs = take_ollama(&mut msgs).unwrap();
        assert_eq!(imgs.len(), 1);
        assert_eq!(msgs[0]["content"], format!("{}hi", marker(0)));
        assert!(msgs[0].get("images").is_none());
    }
}
