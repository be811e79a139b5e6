use crate::state_dict::StateDict;
use ferrofx_core::{DType, Element, Error, Result, Tensor};

/// What every optimizer offers.
pub trait Optimizer {
    /// One update of every parameter that has a gradient.
    fn step(&mut self) -> Result<()>;
    /// Clears the gradients of the parameters (`set_to_none=True`).
    fn zero_grad(&self) {
        for p in self.params() {
            let _ = p.set_grad(None);
        }
    }
    /// The parameters.
    fn params(&self) -> &[Tensor];
    /// The learning rate.
    fn lr(&self) -> f64;
    /// Sets the learning rate (schedulers do this).
    fn set_lr(&mut self, lr: f64);
    /// The optimizer state (per-parameter buffers as `state.{i}.{name}` and hyper-parameters as
    /// `param_groups.0.{name}` scalars), savable with [`crate::save_state_dict`].
    fn state_dict(&self) -> StateDict;
    /// Restores a state from [`Optimizer::state_dict`]; checks parameter count and shapes.
    fn load_state_dict(&mut self, sd: &StateDict) -> Result<()>;
}

/// Elements per parallel task of an update (128 KiB of float32 parameters).
const UPDATE_CHUNK: usize = 1 << 15;

/// One parallel task of an update: a chunk of the parameters, of the gradient and of each state.
type Chunk<'a, T> = (&'a mut [T], &'a [T], Vec<&'a mut [T]>);

/// Runs `f(param, grad, states)` per element (in f64) for a parameter with a gradient and up to
/// three state tensors of its dtype/shape.
///
/// The parameter, its gradient and its states are read and written where they are (no copies),
/// in parallel chunks; a gradient of another dtype is converted first, and a gradient or state
/// that is not contiguous, or shares storage with another operand, is copied out and back.
fn update<const K: usize>(
    op: &str,
    p: &Tensor,
    states: &[Tensor; K],
    f: impl Fn(&mut f64, f64, &mut [f64; K]) + Sync,
) -> Result<()> {
    let Some(g) = p.grad() else { return Ok(()) };
    if g.shape() != p.shape() {
        return Err(Error::shape(
            op,
            format!("gradient shape {:?} differs from parameter shape {:?}", g.shape(), p.shape()),
        ));
    }
    /// The update of one chunk: parameters, gradients, states (same lengths).
    fn chunk<T: Element, const K: usize>(
        pc: &mut [T],
        gc: &[T],
        sc: &mut [&mut [T]],
        f: &(impl Fn(&mut f64, f64, &mut [f64; K]) + Sync),
    ) {
        let mut st = [0f64; K];
        for i in 0..pc.len() {
            let mut x = pc[i].to_f64();
            for (k, s) in sc.iter().enumerate() {
                st[k] = s[i].to_f64();
            }
            f(&mut x, gc[i].to_f64(), &mut st);
            pc[i] = T::from_f64(x);
            for (k, s) in sc.iter_mut().enumerate() {
                s[i] = T::from_f64(st[k]);
            }
        }
    }
    fn run<T: Element, const K: usize>(
        op: &str,
        p: &Tensor,
        g: &Tensor,
        states: &[Tensor; K],
        f: &(impl Fn(&mut f64, f64, &mut [f64; K]) + Sync),
    ) -> Result<()> {
        let g = g.to_dtype(T::DTYPE)?;
        let (ps, pl) = p.concrete(op)?;
        let pr = pl.contiguous_range().ok_or_else(|| Error::argument(op, "parameters must be contiguous"))?;
        // operands read or written in place: contiguous, and no storage shared with another
        // (each gets its own lock); the others are copied out and written back
        let own = |t: &Tensor, others: &[&Tensor]| {
            t.layout().is_some_and(|l| l.contiguous_range().is_some()) && !others.iter().any(|o| o.shares_storage(t))
        };
        let g_others: Vec<&Tensor> = std::iter::once(p).chain(states.iter()).collect();
        let g_in_place = own(&g, &g_others);
        let gcopy: Vec<T> = if g_in_place { Vec::new() } else { g.to_vec::<T>()? };
        let (gs, gl) = g.concrete(op)?;
        let gguard = if g_in_place { Some(gs.read()) } else { None };
        let gd: &[T] = match (&gguard, gl.contiguous_range()) {
            (Some(guard), Some(r)) => {
                &guard.as_slice::<T>().ok_or_else(|| Error::dtype(op, "gradient dtype changed"))?[r]
            }
            _ => &gcopy,
        };
        let mut copies: Vec<Option<Vec<T>>> = Vec::with_capacity(K);
        let mut guards = Vec::with_capacity(K);
        for (k, s) in states.iter().enumerate() {
            let others: Vec<&Tensor> =
                [p, &g].into_iter().chain(states.iter().enumerate().filter(|(j, _)| *j != k).map(|(_, t)| t)).collect();
            if own(s, &others) {
                let (ss, sl) = s.concrete(op)?;
                let r = sl.contiguous_range().ok_or_else(|| Error::argument(op, "state must be contiguous"))?;
                guards.push(Some((ss.write(), r)));
                copies.push(None);
            } else {
                guards.push(None);
                copies.push(Some(s.to_vec::<T>()?));
            }
        }
        {
            let mut guard = ps.write();
            let pd = guard.as_mut_slice::<T>().ok_or_else(|| Error::dtype(op, "parameter dtype changed"))?;
            let pd = &mut pd[pr];
            let mut sds: Vec<&mut [T]> = Vec::with_capacity(K);
            for (g, c) in guards.iter_mut().zip(copies.iter_mut()) {
                match (g, c) {
                    (Some((guard, r)), _) => sds.push(
                        &mut guard.as_mut_slice::<T>().ok_or_else(|| Error::dtype(op, "state dtype changed"))?
                            [r.clone()],
                    ),
                    (None, Some(c)) => sds.push(c),
                    (None, None) => return Err(Error::argument(op, "optimizer state missing")),
                }
            }
            if pd.len() != gd.len() || sds.iter().any(|s| s.len() != pd.len()) {
                return Err(Error::shape(op, "parameter, gradient and state sizes differ"));
            }
            if pd.len() <= UPDATE_CHUNK {
                chunk(pd, gd, &mut sds, f);
            } else {
                use rayon::prelude::*;
                let mut state_chunks: Vec<_> = sds.iter_mut().map(|s| s.chunks_mut(UPDATE_CHUNK)).collect();
                let tasks: Vec<Chunk<'_, T>> = pd
                    .chunks_mut(UPDATE_CHUNK)
                    .zip(gd.chunks(UPDATE_CHUNK))
                    .map(|(pc, gc)| (pc, gc, state_chunks.iter_mut().filter_map(|c| c.next()).collect()))
                    .collect();
                tasks.into_par_iter().for_each(|(pc, gc, mut sc)| chunk(pc, gc, &mut sc, f));
            }
        }
        ps.bump_version();
        drop(guards);
        for (s, c) in states.iter().zip(copies) {
            if let Some(v) = c {
                let (ss, sl) = s.concrete(op)?;
                let r = sl.contiguous_range().ok_or_else(|| Error::argument(op, "state must be contiguous"))?;
                let mut guard = ss.write();
                guard.as_mut_slice::<T>().ok_or_else(|| Error::dtype(op, "state dtype changed"))?[r]
                    .copy_from_slice(&v);
            }
        }
        Ok(())
    }
    match p.dtype() {
        DType::F32 => run::<f32, K>(op, p, &g, states, &f),
        DType::F64 => run::<f64, K>(op, p, &g, states, &f),
        d => Err(Error::dtype(op, format!("optimizers update float32/float64 parameters, got {d}"))),
    }
}

fn zeros_like(p: &Tensor) -> Result<Tensor> {
    ferrofx_core::ops::kernel::zeros(p.shape(), p.dtype())
}

fn check_params(op: &str, params: &[Tensor]) -> Result<()> {
    for (i, p) in params.iter().enumerate() {
        if !p.dtype().is_floating_point() {
            return Err(Error::dtype(
                op,
                format!("parameter {i} has dtype {}; optimizers need floating-point parameters", p.dtype()),
            ));
        }
        if p.storage().is_none() {
            return Err(Error::argument(op, format!("parameter {i} is symbolic")));
        }
    }
    Ok(())
}

fn scalar(v: f64) -> Tensor {
    Tensor::scalar(v)
}

fn get_scalar(sd: &StateDict, key: &str) -> Result<f64> {
    let t = sd.get(key).ok_or_else(|| {
        Error::argument("Optimizer.load_state_dict", format!("missing key \"{key}\" in the optimizer state"))
    })?;
    Ok(t.to_vec_f64()?.first().copied().unwrap_or(0.0))
}

fn load_states(
    op: &str,
    sd: &StateDict,
    params: &[Tensor],
    names: &[&str],
    states: &mut [Vec<Option<Tensor>>],
) -> Result<()> {
    let n = get_scalar(sd, "param_groups.0.num_params")? as usize;
    if n != params.len() {
        return Err(Error::argument(
            op,
            format!("loaded state dict contains a parameter group that doesn't match the size of optimizer's group ({n} vs {})", params.len()),
        ));
    }
    for (k, name) in names.iter().enumerate() {
        for (i, p) in params.iter().enumerate() {
            states[k][i] = match sd.get(&format!("state.{i}.{name}")) {
                None => None,
                Some(t) => {
                    if t.shape() != p.shape() {
                        return Err(Error::shape(
                            op,
                            format!(
                                "state.{i}.{name} has shape {:?}, parameter {i} has shape {:?}",
                                t.shape(),
                                p.shape()
                            ),
                        ));
                    }
                    Some(t.to_dtype(p.dtype())?.contiguous()?.detach())
                }
            };
        }
    }
    Ok(())
}

fn save_states(sd: &mut StateDict, names: &[&str], states: &[Vec<Option<Tensor>>]) {
    for (k, name) in names.iter().enumerate() {
        for (i, s) in states[k].iter().enumerate() {
            if let Some(t) = s {
                sd.insert(format!("state.{i}.{name}"), t.clone());
            }
        }
    }
}

/// `torch.optim.SGD(params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False)`.
pub struct Sgd {
    params: Vec<Tensor>,
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor.
    pub momentum: f64,
    /// Dampening of the momentum.
    pub dampening: f64,
    /// L2 penalty.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    bufs: Vec<Option<Tensor>>,
}

impl Sgd {
    /// A new SGD optimizer.
    pub fn new(
        params: Vec<Tensor>,
        lr: f64,
        momentum: f64,
        dampening: f64,
        weight_decay: f64,
        nesterov: bool,
    ) -> Result<Sgd> {
        check_params("SGD", &params)?;
        if lr < 0.0 {
            return Err(Error::argument("SGD", format!("Invalid learning rate: {lr}")));
        }
        if momentum < 0.0 {
            return Err(Error::argument("SGD", format!("Invalid momentum value: {momentum}")));
        }
        if weight_decay < 0.0 {
            return Err(Error::argument("SGD", format!("Invalid weight_decay value: {weight_decay}")));
        }
        if nesterov && (momentum <= 0.0 || dampening != 0.0) {
            return Err(Error::argument("SGD", "Nesterov momentum requires a momentum and zero dampening"));
        }
        let n = params.len();
        Ok(Sgd { params, lr, momentum, dampening, weight_decay, nesterov, bufs: vec![None; n] })
    }
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        let (lr, mom, damp, wd, nest) = (self.lr, self.momentum, self.dampening, self.weight_decay, self.nesterov);
        for (i, p) in self.params.iter().enumerate() {
            if p.grad().is_none() {
                continue;
            }
            if mom == 0.0 {
                update("SGD", p, &[], |x, g, _| {
                    let g = g + wd * *x;
                    *x -= lr * g;
                })?;
                continue;
            }
            let first = self.bufs[i].is_none();
            if first {
                self.bufs[i] = Some(zeros_like(p)?);
            }
            let buf = self.bufs[i].clone().expect("set above");
            update("SGD", p, &[buf], |x, g, s| {
                let g = g + wd * *x;
                s[0] = if first { g } else { mom * s[0] + (1.0 - damp) * g };
                let d = if nest { g + mom * s[0] } else { s[0] };
                *x -= lr * d;
            })?;
        }
        Ok(())
    }
    fn params(&self) -> &[Tensor] {
        &self.params
    }
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn state_dict(&self) -> StateDict {
        let mut sd = StateDict::new();
        save_states(&mut sd, &["momentum_buffer"], std::slice::from_ref(&self.bufs));
        for (k, v) in [
            ("lr", self.lr),
            ("momentum", self.momentum),
            ("dampening", self.dampening),
            ("weight_decay", self.weight_decay),
            ("nesterov", self.nesterov as u8 as f64),
            ("num_params", self.params.len() as f64),
        ] {
            sd.insert(format!("param_groups.0.{k}"), scalar(v));
        }
        sd
    }
    fn load_state_dict(&mut self, sd: &StateDict) -> Result<()> {
        let mut st = vec![vec![None; self.params.len()]];
        load_states("SGD.load_state_dict", sd, &self.params, &["momentum_buffer"], &mut st)?;
        self.bufs = st.pop().unwrap_or_default();
        self.lr = get_scalar(sd, "param_groups.0.lr")?;
        self.momentum = get_scalar(sd, "param_groups.0.momentum")?;
        self.dampening = get_scalar(sd, "param_groups.0.dampening")?;
        self.weight_decay = get_scalar(sd, "param_groups.0.weight_decay")?;
        self.nesterov = get_scalar(sd, "param_groups.0.nesterov")? != 0.0;
        Ok(())
    }
}

/// `torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0)`; with
/// `decoupled` it is AdamW (weight decay applied to the parameter, default 1e-2).
pub struct Adam {
    params: Vec<Tensor>,
    /// Learning rate.
    pub lr: f64,
    /// `(beta1, beta2)`.
    pub betas: (f64, f64),
    /// Denominator epsilon.
    pub eps: f64,
    /// Weight decay (L2 for Adam, decoupled for AdamW).
    pub weight_decay: f64,
    decoupled: bool,
    steps: Vec<u64>,
    m: Vec<Option<Tensor>>,
    v: Vec<Option<Tensor>>,
}

/// `torch.optim.AdamW`: an [`Adam`] with decoupled weight decay.
pub type AdamW = Adam;

impl Adam {
    /// `Adam(params, lr, betas, eps, weight_decay)`.
    pub fn new(params: Vec<Tensor>, lr: f64, betas: (f64, f64), eps: f64, weight_decay: f64) -> Result<Adam> {
        Adam::make("Adam", params, lr, betas, eps, weight_decay, false)
    }
    /// `AdamW(params, lr, betas, eps, weight_decay)` (PyTorch's default weight decay is 1e-2).
    pub fn adamw(params: Vec<Tensor>, lr: f64, betas: (f64, f64), eps: f64, weight_decay: f64) -> Result<Adam> {
        Adam::make("AdamW", params, lr, betas, eps, weight_decay, true)
    }
    fn make(
        name: &str,
        params: Vec<Tensor>,
        lr: f64,
        betas: (f64, f64),
        eps: f64,
        weight_decay: f64,
        decoupled: bool,
    ) -> Result<Adam> {
        check_params(name, &params)?;
        if lr < 0.0 {
            return Err(Error::argument(name, format!("Invalid learning rate: {lr}")));
        }
        if eps < 0.0 {
            return Err(Error::argument(name, format!("Invalid epsilon value: {eps}")));
        }
        if !(0.0..1.0).contains(&betas.0) {
            return Err(Error::argument(name, format!("Invalid beta parameter at index 0: {}", betas.0)));
        }
        if !(0.0..1.0).contains(&betas.1) {
            return Err(Error::argument(name, format!("Invalid beta parameter at index 1: {}", betas.1)));
        }
        if weight_decay < 0.0 {
            return Err(Error::argument(name, format!("Invalid weight_decay value: {weight_decay}")));
        }
        let n = params.len();
        Ok(Adam {
            params,
            lr,
            betas,
            eps,
            weight_decay,
            decoupled,
            steps: vec![0; n],
            m: vec![None; n],
            v: vec![None; n],
        })
    }
}

impl Optimizer for Adam {
    fn step(&mut self) -> Result<()> {
        let (lr, (b1, b2), eps, wd, dec) = (self.lr, self.betas, self.eps, self.weight_decay, self.decoupled);
        for (i, p) in self.params.iter().enumerate() {
            if p.grad().is_none() {
                continue;
            }
            if self.m[i].is_none() {
                self.m[i] = Some(zeros_like(p)?);
                self.v[i] = Some(zeros_like(p)?);
            }
            self.steps[i] += 1;
            let t = self.steps[i] as i32;
            let bc1 = 1.0 - b1.powi(t);
            let bc2s = (1.0 - b2.powi(t)).sqrt();
            let step_size = lr / bc1;
            let st = [self.m[i].clone().expect("set"), self.v[i].clone().expect("set")];
            update(if dec { "AdamW" } else { "Adam" }, p, &st, |x, g, s| {
                let g = if dec {
                    *x *= 1.0 - lr * wd;
                    g
                } else {
                    g + wd * *x
                };
                s[0] = b1 * s[0] + (1.0 - b1) * g;
                s[1] = b2 * s[1] + (1.0 - b2) * g * g;
                let denom = s[1].sqrt() / bc2s + eps;
                *x -= step_size * s[0] / denom;
            })?;
        }
        Ok(())
    }
    fn params(&self) -> &[Tensor] {
        &self.params
    }
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn state_dict(&self) -> StateDict {
        let mut sd = StateDict::new();
        save_states(&mut sd, &["exp_avg", "exp_avg_sq"], &[self.m.clone(), self.v.clone()]);
        for (i, s) in self.steps.iter().enumerate() {
            if *s > 0 {
                sd.insert(format!("state.{i}.step"), scalar(*s as f64));
            }
        }
        for (k, v) in [
            ("lr", self.lr),
            ("beta1", self.betas.0),
            ("beta2", self.betas.1),
            ("eps", self.eps),
            ("weight_decay", self.weight_decay),
            ("num_params", self.params.len() as f64),
        ] {
            sd.insert(format!("param_groups.0.{k}"), scalar(v));
        }
        sd
    }
    fn load_state_dict(&mut self, sd: &StateDict) -> Result<()> {
        let n = self.params.len();
        let mut st = vec![vec![None; n], vec![None; n]];
        load_states("Adam.load_state_dict", sd, &self.params, &["exp_avg", "exp_avg_sq"], &mut st)?;
        self.v = st.pop().unwrap_or_default();
        self.m = st.pop().unwrap_or_default();
        for i in 0..n {
            self.steps[i] = match sd.get(&format!("state.{i}.step")) {
                Some(t) => t.to_vec_f64()?.first().copied().unwrap_or(0.0) as u64,
                None => 0,
            };
        }
        self.lr = get_scalar(sd, "param_groups.0.lr")?;
        self.betas = (get_scalar(sd, "param_groups.0.beta1")?, get_scalar(sd, "param_groups.0.beta2")?);
        self.eps = get_scalar(sd, "param_groups.0.eps")?;
        self.weight_decay = get_scalar(sd, "param_groups.0.weight_decay")?;
        Ok(())
    }
}

/// `torch.optim.RMSprop(params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0,
/// centered=False)`.
pub struct RmsProp {
    params: Vec<Tensor>,
    /// Learning rate.
    pub lr: f64,
    /// Smoothing constant.
    pub alpha: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// L2 penalty.
    pub weight_decay: f64,
    /// Momentum factor.
    pub momentum: f64,
    /// Normalise by the estimated variance.
    pub centered: bool,
    sq: Vec<Option<Tensor>>,
    gavg: Vec<Option<Tensor>>,
    buf: Vec<Option<Tensor>>,
}

impl RmsProp {
    /// A new RMSprop optimizer.
    pub fn new(
        params: Vec<Tensor>,
        lr: f64,
        alpha: f64,
        eps: f64,
        weight_decay: f64,
        momentum: f64,
        centered: bool,
    ) -> Result<RmsProp> {
        check_params("RMSprop", &params)?;
        if lr < 0.0 {
            return Err(Error::argument("RMSprop", format!("Invalid learning rate: {lr}")));
        }
        if alpha < 0.0 {
            return Err(Error::argument("RMSprop", format!("Invalid alpha value: {alpha}")));
        }
        if momentum < 0.0 {
            return Err(Error::argument("RMSprop", format!("Invalid momentum value: {momentum}")));
        }
        let n = params.len();
        Ok(RmsProp {
            params,
            lr,
            alpha,
            eps,
            weight_decay,
            momentum,
            centered,
            sq: vec![None; n],
            gavg: vec![None; n],
            buf: vec![None; n],
        })
    }
}

impl Optimizer for RmsProp {
    fn step(&mut self) -> Result<()> {
        let (lr, a, eps, wd, mom, cen) =
            (self.lr, self.alpha, self.eps, self.weight_decay, self.momentum, self.centered);
        for (i, p) in self.params.iter().enumerate() {
            if p.grad().is_none() {
                continue;
            }
            if self.sq[i].is_none() {
                self.sq[i] = Some(zeros_like(p)?);
                self.gavg[i] = Some(zeros_like(p)?);
                self.buf[i] = Some(zeros_like(p)?);
            }
            let st = [
                self.sq[i].clone().expect("set"),
                self.gavg[i].clone().expect("set"),
                self.buf[i].clone().expect("set"),
            ];
            update("RMSprop", p, &st, |x, g, s| {
                let g = g + wd * *x;
                s[0] = a * s[0] + (1.0 - a) * g * g;
                let avg = if cen {
                    s[1] = a * s[1] + (1.0 - a) * g;
                    (s[0] - s[1] * s[1]).sqrt() + eps
                } else {
                    s[0].sqrt() + eps
                };
                if mom > 0.0 {
                    s[2] = mom * s[2] + g / avg;
                    *x -= lr * s[2];
                } else {
                    *x -= lr * g / avg;
                }
            })?;
        }
        Ok(())
    }
    fn params(&self) -> &[Tensor] {
        &self.params
    }
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn state_dict(&self) -> StateDict {
        let mut sd = StateDict::new();
        save_states(
            &mut sd,
            &["square_avg", "grad_avg", "momentum_buffer"],
            &[self.sq.clone(), self.gavg.clone(), self.buf.clone()],
        );
        for (k, v) in [
            ("lr", self.lr),
            ("alpha", self.alpha),
            ("eps", self.eps),
            ("weight_decay", self.weight_decay),
            ("momentum", self.momentum),
            ("centered", self.centered as u8 as f64),
            ("num_params", self.params.len() as f64),
        ] {
            sd.insert(format!("param_groups.0.{k}"), scalar(v));
        }
        sd
    }
    fn load_state_dict(&mut self, sd: &StateDict) -> Result<()> {
        let n = self.params.len();
        let mut st = vec![vec![None; n], vec![None; n], vec![None; n]];
        load_states(
            "RMSprop.load_state_dict",
            sd,
            &self.params,
            &["square_avg", "grad_avg", "momentum_buffer"],
            &mut st,
        )?;
        self.buf = st.pop().unwrap_or_default();
        self.gavg = st.pop().unwrap_or_default();
        self.sq = st.pop().unwrap_or_default();
        self.lr = get_scalar(sd, "param_groups.0.lr")?;
        self.alpha = get_scalar(sd, "param_groups.0.alpha")?;
        self.eps = get_scalar(sd, "param_groups.0.eps")?;
        self.weight_decay = get_scalar(sd, "param_groups.0.weight_decay")?;
        self.momentum = get_scalar(sd, "param_groups.0.momentum")?;
        self.centered = get_scalar(sd, "param_groups.0.centered")? != 0.0;
        Ok(())
    }
}
