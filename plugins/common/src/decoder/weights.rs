//! The weights of a decoder: loading the standard tensors, assembling a family's own mapping
//! with shape checks, and converting every projection matrix at once.

use super::checks::check_layer;
use super::config::DecoderConfig;
use crate::layers::{AttnWeights, Ffn, GatedFfn, KvSource, LayerWeights, Mixer, Ple};
use crate::weights::{Matrix, Role, TensorId, Weights};
use berth_plugin_api::PluginError;

/// What a load did with the pack's cache of packed weights ([`DecoderWeights::store_packed`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackReport {
    /// Matrices read back packed from the cache.
    pub read: usize,
    /// Matrices packed by this load (not in the cache, or stale there).
    pub packed: usize,
    /// Whether this load wrote the cache.
    pub written: bool,
    /// Why writing the cache failed, when it did (the load goes on without it).
    pub error: Option<String>,
}

/// All decoder weights.
#[derive(Clone, Debug)]
pub struct DecoderWeights {
    /// Token embeddings (`vocab × hidden`).
    pub embed: Matrix,
    /// Layers.
    pub layers: Vec<LayerWeights>,
    /// Final norm.
    pub output_norm: Vec<f32>,
    /// LM head (`vocab × hidden`); the embedding when tied.
    pub output: Matrix,
    /// Per-layer embeddings (Gemma 4), set by [`DecoderWeights::with_ple`].
    pub ple: Option<Ple>,
    /// Multiplier of each layer's output (Gemma 4's `layer_scalar`), set by
    /// [`DecoderWeights::with_layer_scalars`].
    pub layer_scalars: Option<Vec<f32>>,
}

fn need(w: &Weights, id: TensorId, flag: bool) -> Result<Option<Vec<f32>>, PluginError> {
    if flag {
        w.vector(&id).map(Some)
    } else {
        Ok(None)
    }
}

impl DecoderWeights {
    /// Converts every projection matrix (embedding, head, attention, short convolution, gated
    /// delta-net, dense and expert feed-forwards, routers) to f32, so a run multiplies f32 weights
    /// by f32 activations: the load option `dequantize`, the reference a quantised run's KL
    /// divergence is measured against. A tied head stays one matrix.
    pub fn dequantize(&mut self) {
        self.convert(&Matrix::to_f32);
    }

    /// Quantizes every projection matrix (as [`DecoderWeights::dequantize`] lists them) to Q8_0,
    /// as llama.cpp's `--outtype q8_0` does: the load option `quantize = "q8_0"` for f32 or bf16
    /// packs, a quarter of the memory and the packed integer kernels. Matrices already quantized
    /// stay as they are.
    pub fn quantize_q8_0(&mut self) {
        self.convert(&Matrix::to_q8_0);
    }

    /// Applies `f` to every projection matrix; a tied head stays one matrix.
    fn convert(&mut self, f: &dyn Fn(&Matrix) -> Matrix) {
        let tied = self.output.same_as(&self.embed);
        self.embed = f(&self.embed);
        self.output = if tied { self.embed.clone() } else { f(&self.output) };
        for m in self.layer_matrices() {
            *m = f(m);
        }
    }

    /// The weights as a loaded model serves them: every matrix the packed kernels take is packed
    /// now (no request waits for packing) and then held only in that form; an untied embedding
    /// keeps its rows (looked up row by row), a tied one is the packed head, whose rows are
    /// read back from the packed form ([`Matrix::dequantize_row`]), so no weight is held twice.
    /// Every matrix is already in memory the process owns ([`Weights`] reads the files), so
    /// after this the model needs nothing from its files.
    pub fn for_serving(&mut self) {
        if self.output.same_as(&self.embed) {
            self.output = self.output.for_serving(false);
            self.embed = self.output.clone();
        } else {
            self.output = self.output.for_serving(false);
        }
        for m in self.layer_matrices() {
            *m = m.for_serving(false);
        }
        if let Some(p) = &mut self.ple {
            // The per-layer table is looked up by rows; its projections are products.
            p.projection = p.projection.for_serving(false);
            for l in &mut p.layers {
                l.gate = l.gate.for_serving(false);
                l.proj = l.proj.for_serving(false);
            }
        }
    }

    /// Writes every matrix this load holds only packed into the pack's cache of packed weights
    /// (see [`crate::pack_cache`]), so the next load of the same file reads them back instead of
    /// packing; call it after [`DecoderWeights::for_serving`]. Does nothing when the weights
    /// were opened without a cache or every such matrix came from it. Returns what the load
    /// did: matrices read back, matrices packed, and whether the cache was written.
    pub fn store_packed(&self) -> PackReport {
        let mut me = self.clone();
        let mut all: Vec<Matrix> = vec![me.embed.clone(), me.output.clone()];
        all.extend(me.layer_matrices().into_iter().map(|m| m.clone()));
        if let Some(p) = &me.ple {
            all.push(p.projection.clone());
            for l in &p.layers {
                all.extend([l.gate.clone(), l.proj.clone()]);
            }
        }
        let mut report = PackReport::default();
        let mut seen = std::collections::HashSet::new();
        let mut entries = Vec::new();
        let mut cache = None;
        for m in &all {
            if let Some((c, name, p, from_cache)) = m.cache_entry() {
                if seen.insert(name) {
                    if from_cache {
                        report.read += 1;
                    } else {
                        report.packed += 1;
                    }
                    entries.push((name, p, from_cache));
                    cache = Some(c);
                }
            }
        }
        if let Some(c) = cache {
            match c.store(&entries) {
                Ok(w) => report.written = w,
                Err(e) => report.error = Some(e.to_string()),
            }
        }
        report
    }

    /// Bytes the matrices hold (raw rows and packed forms; a matrix shared by several places,
    /// such as a tied head, counted once per place).
    pub fn held_bytes(&self) -> usize {
        let mut all = vec![&self.embed];
        if !self.output.same_as(&self.embed) {
            all.push(&self.output);
        }
        let mut me = self.clone();
        let layers: usize = me.layer_matrices().iter().map(|m| m.held_bytes()).sum();
        all.iter().map(|m| m.held_bytes()).sum::<usize>() + layers
    }

    /// Every projection matrix of the layers (attention, short convolution, gated delta-net,
    /// dense and expert feed-forwards, routers).
    fn layer_matrices(&mut self) -> Vec<&mut Matrix> {
        let mut out: Vec<&mut Matrix> = Vec::new();
        fn ffn<'a>(g: &'a mut GatedFfn, out: &mut Vec<&'a mut Matrix>) {
            out.extend([&mut g.gate, &mut g.up, &mut g.down]);
        }
        for l in &mut self.layers {
            match &mut l.mixer {
                Mixer::Attention(a) => {
                    out.extend([&mut a.wq, &mut a.wo]);
                    if let KvSource::Own { wk, wv, .. } = &mut a.kv {
                        out.push(wk);
                        if let Some(v) = wv {
                            out.push(v);
                        }
                    }
                }
                Mixer::ShortConv(c) => out.extend([&mut c.in_proj, &mut c.out_proj]),
                Mixer::GatedDeltaNet(d) => out.extend([
                    &mut d.in_qkv,
                    &mut d.in_z,
                    &mut d.in_b,
                    &mut d.in_a,
                    &mut d.out_proj,
                ]),
            }
            match &mut l.ffn {
                Ffn::Dense(dense) => ffn(dense, &mut out),
                Ffn::Moe {
                    router,
                    experts,
                    shared,
                    ..
                } => {
                    out.push(router);
                    experts.iter_mut().for_each(|e| ffn(e, &mut out));
                    if let Some(s) = shared {
                        ffn(&mut s.ffn, &mut out);
                        if let Some(g) = &mut s.gate {
                            out.push(g);
                        }
                    }
                }
                Ffn::DenseMoe(d) => {
                    ffn(&mut d.dense, &mut out);
                    out.push(&mut d.router);
                    d.experts.iter_mut().for_each(|e| ffn(e, &mut out));
                }
            }
        }
        out
    }

    /// Loads the standard decoder tensors named by [`TensorId`]s, honouring the config's switches.
    pub fn load(w: &Weights, cfg: &DecoderConfig) -> Result<DecoderWeights, PluginError> {
        let embed = w.matrix(&TensorId::global(Role::TokenEmbd))?;
        let out_id = TensorId::global(Role::Output);
        let output = if cfg.tie_embeddings || !w.has(&out_id) {
            embed.clone()
        } else {
            w.matrix(&out_id)?
        };
        let layers = (0..cfg.n_layers)
            .map(|i| standard_layer(w, cfg, i))
            .collect::<Result<Vec<_>, _>>()?;
        DecoderWeights::new(
            cfg,
            embed,
            layers,
            w.vector(&TensorId::global(Role::OutputNorm))?,
            output,
        )
    }

    /// Assembles weights a family mapped itself, checking every layer's shapes against `cfg`.
    pub fn new(
        cfg: &DecoderConfig,
        embed: Matrix,
        layers: Vec<LayerWeights>,
        output_norm: Vec<f32>,
        output: Matrix,
    ) -> Result<DecoderWeights, PluginError> {
        if layers.len() != cfg.n_layers {
            return Err(PluginError::failed(format!(
                "{} layers mapped; the config has {}",
                layers.len(),
                cfg.n_layers
            )));
        }
        for (i, l) in layers.iter().enumerate() {
            check_layer(l, cfg, i)?;
        }
        if embed.cols != cfg.hidden || output.cols != cfg.hidden || output_norm.len() != cfg.hidden {
            return Err(PluginError::failed(format!(
                "embedding/output/norm width {}/{}/{} differs from hidden size {}",
                embed.cols,
                output.cols,
                output_norm.len(),
                cfg.hidden
            )));
        }
        for (i, l) in layers.iter().enumerate() {
            if let Mixer::Attention(a) = &l.mixer {
                if let KvSource::Shared(src) = a.kv {
                    let geometry = layers[..i].get(src).and_then(|s| match &s.mixer {
                        Mixer::Attention(b) if matches!(b.kv, KvSource::Own { .. }) => Some(b.geometry(cfg)),
                        _ => None,
                    });
                    let (hd, nkv) = a.geometry(cfg);
                    if geometry != Some((hd, nkv)) {
                        return Err(PluginError::failed(format!(
                            "layer {i}: layer {src} is no earlier attention layer with its own cache of {nkv} heads of {hd}"
                        )));
                    }
                }
            }
        }
        Ok(DecoderWeights {
            embed,
            layers,
            output_norm,
            output,
            ple: None,
            layer_scalars: None,
        })
    }

    /// Adds per-layer embeddings, checking their shapes.
    pub fn with_ple(mut self, ple: Ple) -> Result<DecoderWeights, PluginError> {
        let (n, h, d) = (self.layers.len(), self.embed.cols, ple.dim);
        let layers_ok = ple.layers.len() == n
            && ple.layers.iter().all(|l| {
                (
                    l.gate.rows,
                    l.gate.cols,
                    l.proj.rows,
                    l.proj.cols,
                    l.post_norm.len(),
                ) == (d, h, h, d, h)
            });
        if d == 0
            || ple.embed.cols != n * d
            || (ple.projection.rows, ple.projection.cols) != (n * d, h)
            || ple.norm.len() != d
            || !layers_ok
        {
            return Err(PluginError::failed(format!(
                "per-layer embeddings {:?} / projection {:?} do not fit {n} layers of {d} and hidden {h}",
                ple.embed, ple.projection
            )));
        }
        self.ple = Some(ple);
        Ok(self)
    }

    /// Sets a multiplier of each layer's output.
    pub fn with_layer_scalars(mut self, scalars: Vec<f32>) -> Result<DecoderWeights, PluginError> {
        if scalars.len() != self.layers.len() {
            return Err(PluginError::failed(format!(
                "{} layer scalars for {} layers",
                scalars.len(),
                self.layers.len()
            )));
        }
        self.layer_scalars = Some(scalars);
        Ok(self)
    }

    /// Token ids the embeddings cover (the smaller table's rows when there are per-layer ones).
    pub fn vocab_in(&self) -> usize {
        self.ple
            .as_ref()
            .map_or(self.embed.rows, |p| p.embed.rows.min(self.embed.rows))
    }
}

/// Layer `i` of the standard tensors: attention, then a dense or (with a MoE config) routed FFN.
fn standard_layer(w: &Weights, cfg: &DecoderConfig, i: usize) -> Result<LayerWeights, PluginError> {
    let id = |r| TensorId::layer(r, i);
    Ok(LayerWeights {
        attn_norm: w.vector(&id(Role::AttnNorm))?,
        mixer: Mixer::Attention(Box::new(AttnWeights {
            wq: w.matrix(&id(Role::AttnQ))?,
            wo: w.matrix(&id(Role::AttnOut))?,
            bo: None,
            sinks: None,
            bq: need(w, id(Role::AttnQ).bias(), cfg.qkv_bias)?,
            q_norm: need(w, id(Role::AttnQNorm), cfg.qk_norm)?,
            kv: KvSource::Own {
                wk: w.matrix(&id(Role::AttnK))?,
                wv: Some(w.matrix(&id(Role::AttnV))?),
                bk: need(w, id(Role::AttnK).bias(), cfg.qkv_bias)?,
                bv: need(w, id(Role::AttnV).bias(), cfg.qkv_bias)?,
                k_norm: need(w, id(Role::AttnKNorm), cfg.qk_norm)?,
            },
            gated: false,
            v_norm: false,
            shape: None,
        })),
        post_attn_norm: need(w, id(Role::PostAttnNorm), cfg.post_norms)?,
        ffn_norm: w.vector(&id(Role::FfnNorm))?,
        post_ffw_norm: need(w, id(Role::PostFfwNorm), cfg.post_norms)?,
        ffn: standard_ffn(w, cfg, i)?,
    })
}

/// Layer `i`'s standard feed-forward: one gated FFN, or the router and experts with a MoE config.
fn standard_ffn(w: &Weights, cfg: &DecoderConfig, i: usize) -> Result<Ffn, PluginError> {
    let id = |r| TensorId::layer(r, i);
    let Some(m) = cfg.moe else {
        return Ok(Ffn::Dense(GatedFfn {
            gate: w.matrix(&id(Role::FfnGate))?,
            up: w.matrix(&id(Role::FfnUp))?,
            down: w.matrix(&id(Role::FfnDown))?,
        }));
    };
    let gates = w.experts(Role::FfnGateExps, i, m.n_experts)?;
    let ups = w.experts(Role::FfnUpExps, i, m.n_experts)?;
    let downs = w.experts(Role::FfnDownExps, i, m.n_experts)?;
    Ok(Ffn::Moe {
        router: w.matrix(&id(Role::FfnGateInp))?,
        experts: (gates.into_iter().zip(ups).zip(downs))
            .map(|((gate, up), down)| GatedFfn { gate, up, down })
            .collect(),
        selection_bias: None,
        shared: None,
        biases: None,
    })
}
