//! Sharded checkpoints: every rank writes its part of a model's state dict to a safetensors
//! file of its own, and rank 0 writes an index naming the file of every tensor, in Hugging
//! Face's layout (`model.safetensors.index.json`: `{"metadata": {...}, "weight_map": {name:
//! file}}`). [`load_sharded_state_dict`] reassembles the whole state dict on one machine.
//!
//! For `-o digits_cnn.safetensors` over 2 ranks the files are `digits_cnn-00001-of-00002.safetensors`,
//! `digits_cnn-00002-of-00002.safetensors` and the index `digits_cnn.safetensors.index.json`.
//! The index is written last, after every rank reported its shard written, so an index on disk
//! means a complete checkpoint.
//!
//! Who writes what is decided by an *owner map* (name → rank) that every rank computes the same
//! way without communicating: in data-parallel training every rank holds the whole model and
//! [`assign_by_size`] cuts the state dict into contiguous ranges of about equal bytes; in a
//! pipeline each rank writes the tensors of its own stage.
//!
//! ```
//! # fn main() -> ferrofx_core::Result<()> {
//! use ferrofx_core::Tensor;
//! use ferrofx_dist::shards::{assign_by_size, load_sharded_state_dict, save_sharded, index_path};
//! let sd: ferrofx_nn::StateDict = [
//!     ("a".to_string(), Tensor::from_vec(vec![1.0f32; 6], &[2, 3])?),
//!     ("b".to_string(), Tensor::from_vec(vec![2.0f32; 6], &[6])?),
//! ]
//! .into_iter()
//! .collect();
//! let dir = tempfile::tempdir().unwrap();
//! let out = dir.path().join("model.safetensors");
//! // a job of one rank writes one shard and the index
//! let pg = ferrofx_dist::ProcessGroup::init()?;
//! save_sharded(&out, &sd, &assign_by_size(&sd, pg.world_size()), &pg)?;
//! let back = load_sharded_state_dict(&index_path(&out))?;
//! assert_eq!(back["b"].to_vec::<f32>()?, vec![2.0; 6]);
//! # Ok(()) }
//! ```

use crate::process_group::ProcessGroup;
use ferrofx_core::{Error, Result};
use ferrofx_nn::StateDict;
use indexmap::IndexMap;
use std::path::{Path, PathBuf};

const OP: &str = "sharded checkpoint";

/// Which rank writes each tensor of a sharded checkpoint (tensor name → rank).
pub type Owners = IndexMap<String, usize>;

/// An index larger than this is refused before it is read (an index of a million tensors is a
/// few tens of MB).
const MAX_INDEX_BYTES: u64 = 256 << 20;

/// The shard file rank `rank` of `world` writes for the checkpoint `out`
/// (`digits_cnn.safetensors` → `digits_cnn-00001-of-00002.safetensors` for rank 0 of 2).
pub fn shard_path(out: &Path, rank: usize, world: usize) -> PathBuf {
    let stem = out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
    let ext = out.extension().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "safetensors".into());
    out.with_file_name(format!("{stem}-{:05}-of-{world:05}.{ext}", rank + 1))
}

/// The index of the checkpoint `out` (`digits_cnn.safetensors` →
/// `digits_cnn.safetensors.index.json`).
pub fn index_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().map(|s| s.to_os_string()).unwrap_or_else(|| "model.safetensors".into());
    name.push(".index.json");
    out.with_file_name(name)
}

/// Cuts `sd` into `world` contiguous ranges (in its key order) of about equal bytes: each
/// tensor goes to the rank whose share holds the middle of its bytes. Every rank computes the
/// same map from the same model.
pub fn assign_by_size(sd: &StateDict, world: usize) -> Owners {
    let world = world.max(1);
    let bytes: Vec<u128> = sd.values().map(|t| (t.numel() * t.dtype().size()) as u128).collect();
    let total: u128 = bytes.iter().sum::<u128>().max(1);
    let mut before = 0u128;
    let mut owners = IndexMap::with_capacity(sd.len());
    for (name, b) in sd.keys().zip(&bytes) {
        // twice the middle of this tensor's bytes, to stay in integers
        let mid2 = 2 * before + b;
        let r = ((mid2 * world as u128) / (2 * total)).min(world as u128 - 1) as usize;
        owners.insert(name.clone(), r);
        before += b;
    }
    owners
}

/// Writes this rank's shard of a checkpoint: the tensors of `local` that `owners` gives to this
/// rank, to [`shard_path`]`(out, rank, world)`; then, once every rank reported its shard written,
/// rank 0 writes the index ([`index_path`]). Every rank calls it (it communicates), with the same
/// `owners`. Returns the files this rank wrote.
///
/// Errors (on every rank, naming the rank that failed): an owner outside the job, a tensor given
/// to this rank that `local` does not hold, a shard that could not be written.
pub fn save_sharded(out: &Path, local: &StateDict, owners: &Owners, pg: &ProcessGroup) -> Result<Vec<PathBuf>> {
    let (rank, world) = (pg.rank(), pg.world_size());
    let mine = || -> Result<PathBuf> {
        if let Some((name, r)) = owners.iter().find(|(_, &r)| r >= world) {
            return Err(Error::argument(
                OP,
                format!("'{name}' is given to rank {r}, but the job has {world} ranks (0..{world})"),
            ));
        }
        let mut shard = StateDict::new();
        for (name, _) in owners.iter().filter(|(_, &r)| r == rank) {
            let t = local.get(name).ok_or_else(|| {
                Error::argument(
                    OP,
                    format!(
                        "rank {rank} must write '{name}' but does not hold it (it holds {} tensors): the owner map \
                         and this rank's state dict disagree",
                        local.len()
                    ),
                )
            })?;
            shard.insert(name.clone(), t.clone());
        }
        let path = shard_path(out, rank, world);
        let meta = [("format".to_string(), "pt".to_string()), ("shard".to_string(), format!("{}/{world}", rank + 1))];
        ferrofx_nn::state_dict::save_state_dict_with_metadata(&shard, Some(meta.into_iter().collect()), &path)?;
        Ok(path)
    };
    let result = mine();
    // every rank learns whether every shard was written before the index goes out
    let status = pg.all_gather_u64(u64::from(result.is_err()))?;
    let path = result.map_err(|e| Error::argument(OP, format!("rank {rank}: {e}")))?;
    let failed: Vec<usize> = status.iter().enumerate().filter(|(_, &s)| s != 0).map(|(r, _)| r).collect();
    if !failed.is_empty() {
        return Err(Error::argument(
            OP,
            format!("rank {rank}: ranks {failed:?} could not write their shards; no index was written"),
        ));
    }
    let mut written = vec![path];
    if rank == 0 {
        let mut weight_map = serde_json::Map::new();
        for (name, &r) in owners {
            let file = shard_path(out, r, world);
            let file = file.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            weight_map.insert(name.clone(), serde_json::Value::String(file));
        }
        let index = serde_json::json!({
            "metadata": { "format": "ferrofx sharded state dict", "world_size": world, "tensors": owners.len() },
            "weight_map": weight_map,
        });
        let text = serde_json::to_string_pretty(&index).map_err(|e| Error::io(OP, e.to_string()))?;
        let path = index_path(out);
        ferrofx_core::atomic_file::write_atomic_bytes(OP, &path, text.as_bytes())?;
        written.push(path);
    }
    Ok(written)
}

/// Reads a sharded checkpoint on one machine: the index at `index` (see the module docs) and
/// every shard file it names, which must sit next to it. Returns the whole state dict. Errors name the file and the tensor: an index that is not one, a shard
/// name that is a path (`../x`), a missing shard, a tensor missing from its shard, or a shard
/// holding tensors the index does not give it (files of different saves). The state dict is
/// in the index's order (names sorted); load it into a module by name.
pub fn load_sharded_state_dict(index: &Path) -> Result<StateDict> {
    let shown = index.display();
    let md = std::fs::metadata(index).map_err(|e| Error::io(OP, format!("cannot read the index {shown}: {e}")))?;
    if md.len() > MAX_INDEX_BYTES {
        return Err(Error::io(
            OP,
            format!("the index {shown} is {} bytes, more than the {MAX_INDEX_BYTES} an index can be", md.len()),
        ));
    }
    let text = std::fs::read(index).map_err(|e| Error::io(OP, format!("cannot read the index {shown}: {e}")))?;
    let json: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| Error::io(OP, format!("{shown} is not a JSON index of a sharded checkpoint: {e}")))?;
    let map = json.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| {
        Error::io(OP, format!("{shown} has no \"weight_map\" object (tensor name → shard file): it is not an index"))
    })?;
    let dir = index.parent().unwrap_or_else(|| Path::new(""));
    // shard file → the tensors it must hold, in index order
    let mut files: IndexMap<String, Vec<String>> = IndexMap::new();
    for (name, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| Error::io(OP, format!("{shown}: the shard of '{name}' is {file}, not a file name")))?;
        let plain = Path::new(file).file_name().is_some_and(|f| f == std::ffi::OsStr::new(file));
        if !plain || file == "." || file == ".." {
            return Err(Error::io(
                OP,
                format!(
                    "{shown}: the shard of '{name}' is '{file}', which is not a plain file name: shard files must sit \
                     next to their index"
                ),
            ));
        }
        files.entry(file.to_string()).or_default().push(name.clone());
    }
    let mut shards: IndexMap<String, StateDict> = IndexMap::new();
    for (file, names) in &files {
        let path = dir.join(file);
        let sd = ferrofx_nn::load_state_dict_file(&path)
            .map_err(|e| Error::io(OP, format!("{shown} names the shard {}: {e}", path.display())))?;
        let wanted: std::collections::HashSet<&String> = names.iter().collect();
        if let Some(extra) = sd.keys().find(|k| !wanted.contains(k)) {
            return Err(Error::io(
                OP,
                format!(
                    "{} holds '{extra}', which the index {shown} does not give to it: the shards and the index come \
                     from different saves",
                    path.display()
                ),
            ));
        }
        shards.insert(file.clone(), sd);
    }
    let mut out = StateDict::with_capacity(map.len());
    for (name, file) in map {
        let file = file.as_str().unwrap_or_default();
        let t = shards.get_mut(file).and_then(|sd| sd.shift_remove(name)).ok_or_else(|| {
            Error::io(
                OP,
                format!(
                    "the index {shown} puts '{name}' in {}, which does not hold it: the shards and the index come \
                     from different saves",
                    dir.join(file).display()
                ),
            )
        })?;
        out.insert(name.clone(), t);
    }
    Ok(out)
}
