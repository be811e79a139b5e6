use super::Optimizer;
use ferrofx_core::{Error, Result};
use std::f64::consts::PI;

/// An LR scheduler: call [`LrScheduler::step`] after each `optimizer.step()` (per epoch for
/// StepLR/CosineAnnealingLR, per batch for OneCycleLR), as in PyTorch.
pub trait LrScheduler {
    /// Advances one step and sets the optimizer's learning rate.
    fn step(&mut self, opt: &mut dyn Optimizer) -> Result<()>;
    /// The learning rate last set.
    fn get_last_lr(&self) -> f64;
}

/// `StepLR(step_size, gamma=0.1)`: `lr = base * gamma^(epoch // step_size)`.
pub struct StepLR {
    base: f64,
    step_size: u64,
    gamma: f64,
    epoch: u64,
    last: f64,
}

impl StepLR {
    /// Starts from the optimizer's current learning rate.
    pub fn new(opt: &dyn Optimizer, step_size: u64, gamma: f64) -> Result<StepLR> {
        if step_size == 0 {
            return Err(Error::argument("StepLR", "step_size must be positive"));
        }
        Ok(StepLR { base: opt.lr(), step_size, gamma, epoch: 0, last: opt.lr() })
    }
}

impl LrScheduler for StepLR {
    fn step(&mut self, opt: &mut dyn Optimizer) -> Result<()> {
        self.epoch += 1;
        self.last = self.base * self.gamma.powi((self.epoch / self.step_size) as i32);
        opt.set_lr(self.last);
        Ok(())
    }
    fn get_last_lr(&self) -> f64 {
        self.last
    }
}

/// `CosineAnnealingLR(T_max, eta_min=0)`: `eta_min + (base - eta_min)(1 + cos(pi t / T_max)) / 2`.
pub struct CosineAnnealingLR {
    base: f64,
    t_max: u64,
    eta_min: f64,
    epoch: u64,
    last: f64,
}

impl CosineAnnealingLR {
    /// Starts from the optimizer's current learning rate.
    pub fn new(opt: &dyn Optimizer, t_max: u64, eta_min: f64) -> Result<CosineAnnealingLR> {
        if t_max == 0 {
            return Err(Error::argument("CosineAnnealingLR", "T_max must be positive"));
        }
        Ok(CosineAnnealingLR { base: opt.lr(), t_max, eta_min, epoch: 0, last: opt.lr() })
    }
}

impl LrScheduler for CosineAnnealingLR {
    fn step(&mut self, opt: &mut dyn Optimizer) -> Result<()> {
        self.epoch += 1;
        let t = self.epoch as f64;
        self.last = self.eta_min + (self.base - self.eta_min) * (1.0 + (PI * t / self.t_max as f64).cos()) / 2.0;
        opt.set_lr(self.last);
        Ok(())
    }
    fn get_last_lr(&self) -> f64 {
        self.last
    }
}

/// `OneCycleLR(max_lr, total_steps, pct_start=0.3, anneal_strategy='cos', div_factor=25,
/// final_div_factor=1e4, three_phase=False, cycle_momentum=False)`: sets the learning rate to
/// `max_lr / div_factor` at construction, rises to `max_lr` over `pct_start` of the steps and
/// anneals (cosine) to `initial / final_div_factor`. Momentum cycling is not done.
pub struct OneCycleLR {
    initial: f64,
    max_lr: f64,
    min_lr: f64,
    total: u64,
    pct_start: f64,
    step_num: u64,
    last: f64,
}

impl OneCycleLR {
    /// Sets the optimizer's learning rate to the initial one.
    pub fn new(
        opt: &mut dyn Optimizer,
        max_lr: f64,
        total_steps: u64,
        pct_start: f64,
        div_factor: f64,
        final_div_factor: f64,
    ) -> Result<OneCycleLR> {
        if total_steps == 0 {
            return Err(Error::argument("OneCycleLR", "Expected positive integer total_steps, but got 0"));
        }
        if !(0.0..=1.0).contains(&pct_start) {
            return Err(Error::argument(
                "OneCycleLR",
                format!("Expected float between 0 and 1 pct_start, but got {pct_start}"),
            ));
        }
        let initial = max_lr / div_factor;
        opt.set_lr(initial);
        Ok(OneCycleLR {
            initial,
            max_lr,
            min_lr: initial / final_div_factor,
            total: total_steps,
            pct_start,
            step_num: 0,
            last: initial,
        })
    }
    fn lr_at(&self, step: u64) -> f64 {
        let cos = |start: f64, end: f64, pct: f64| end + (start - end) / 2.0 * ((PI * pct).cos() + 1.0);
        let end1 = self.pct_start * self.total as f64 - 1.0;
        let end2 = self.total as f64 - 1.0;
        let s = step as f64;
        if s <= end1 {
            cos(self.initial, self.max_lr, if end1 > 0.0 { s / end1 } else { 1.0 })
        } else {
            cos(self.max_lr, self.min_lr, (s - end1) / (end2 - end1))
        }
    }
}

impl LrScheduler for OneCycleLR {
    fn step(&mut self, opt: &mut dyn Optimizer) -> Result<()> {
        self.step_num += 1;
        if self.step_num > self.total {
            return Err(Error::argument(
                "OneCycleLR",
                format!(
                    "Tried to step {} times. The specified number of total steps is {}",
                    self.step_num + 1,
                    self.total
                ),
            ));
        }
        self.last = self.lr_at(self.step_num);
        opt.set_lr(self.last);
        Ok(())
    }
    fn get_last_lr(&self) -> f64 {
        self.last
    }
}
