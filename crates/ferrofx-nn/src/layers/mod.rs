//! Built-in layers with PyTorch's defaults and initialisation. All are tracing leaves
//! ([`crate::Module::is_builtin_leaf`]), as `torch.nn` modules are for FX.

mod activation;
mod attention;
mod conv;
mod embedding;
mod linear;
mod norm;
mod pool;
mod rnn;

pub use activation::{Dropout, Hardswish, LeakyReLU, LogSoftmax, ReLU, ReLU6, SiLU, Sigmoid, Softmax, Tanh, ELU, GELU};
pub use attention::{MultiheadAttention, TransformerEncoderLayer};
pub use conv::{Conv1d, Conv2d, Conv2dOpts, ConvTranspose2d};
pub use embedding::Embedding;
pub use linear::{Bilinear, Flatten, Identity, Linear};
pub use norm::{BatchNorm, BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm};
pub use pool::{AdaptiveAvgPool2d, AvgPool2d, MaxPool2d};
pub use rnn::LSTM;
