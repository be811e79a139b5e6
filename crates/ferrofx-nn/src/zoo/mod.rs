//! The model zoo: [`Mlp`], [`DigitsCnn`], [`ResNet`] (ResNet-18/50 with torchvision's layout and
//! key names), [`MobileNetV2`] (torchvision layout), [`TransformerClassifier`], [`BertModel`]
//! (Hugging Face layout and key names) with [`SentenceTransformer`] (all-MiniLM-L6-v2 sentence
//! embeddings from a model folder), and [`catalogue`]: every family at test size, for tests.

mod bert;
mod bert_tokenizer;
mod catalogue;
mod cnn;
mod mobilenet;
mod resnet;
mod sentence_transformer;
mod transformer;

pub use bert::{
    BertAttention, BertConfig, BertEmbeddings, BertEncoder, BertIntermediate, BertLayer, BertModel, BertResidualOutput,
    BertSelfAttention,
};
pub use bert_tokenizer::{BertTokenizer, TokenBatch};
pub use catalogue::{catalogue, ZooModel};
pub use cnn::{DigitsCnn, Mlp};
pub use mobilenet::MobileNetV2;
pub use resnet::{BasicBlock, Bottleneck, ResNet};
pub use sentence_transformer::{Pooling, SentenceEmbedder, SentenceTransformer};
pub use transformer::TransformerClassifier;
