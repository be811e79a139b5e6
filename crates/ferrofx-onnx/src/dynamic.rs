//! Dynamic dimensions: an ONNX model whose inputs have symbolic sizes (`batch_size`,
//! `sequence`), run at any size.
//!
//! The registry's ops take concrete shapes (a `reshape` records its target sizes, a folded
//! `Shape` chain its values), so an imported GraphModule is specialised to the sizes it was
//! imported with. [`OnnxModel`] keeps the decoded file and specialises **at the first run** of
//! each input-shape signature: it imports the model for the actual input shapes, caches that
//! GraphModule (at most [`MAX_SPECIALISATIONS`], least recently used dropped) and runs it, so
//! the same model serves batch 1 and batch 32. Inputs that do not fit the file's declared
//! shapes are refused with the declared and given shapes; every specialisation runs under its
//! memory budget ([`OnnxModel::set_max_memory`]).

use crate::import::{import_model, ImportOptions, InputSpec, OnnxProgram};
use crate::model::ModelFile;
use ferrofx_core::{Error, Result, Tensor, Value};
use ferrofx_fx::GraphModule;
use ferrofx_nn::{Module, ModuleStructure, TensorKind};
use std::any::Any;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The most input-shape signatures an [`OnnxModel`] keeps a GraphModule for.
pub const MAX_SPECIALISATIONS: usize = 8;

type Cache = Vec<(Vec<Vec<usize>>, Arc<GraphModule>)>;

/// An ONNX model that specialises to its input shapes at the first run of each shape.
///
/// ```no_run
/// use ferrofx_nn::Module;
/// let model = ferrofx_onnx::OnnxModel::open("model.onnx")?; // input [batch_size, 3, 224, 224]
/// let one = model.forward(&ferrofx_core::ops::creation::zeros(&[1, 3, 224, 224], None)?)?;
/// let many = model.forward(&ferrofx_core::ops::creation::zeros(&[8, 3, 224, 224], None)?)?;
/// assert_eq!(model.specialisations(), vec![vec![vec![1, 3, 224, 224]], vec![vec![8, 3, 224, 224]]]);
/// # Ok::<(), ferrofx_core::Error>(())
/// ```
pub struct OnnxModel {
    file: ModelFile,
    options: ImportOptions,
    program: OnnxProgram,
    cache: Mutex<Cache>,
    max_memory: Mutex<Option<u64>>,
}

impl OnnxModel {
    /// Reads the model at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<OnnxModel> {
        let file = ModelFile::open(path.as_ref())?;
        OnnxModel::new(file, ImportOptions::default())
    }

    /// A model from a decoded file; `options.constants` fixes inputs as for [`import_model`]
    /// (`input_shapes` and `dynamic_dim` are ignored: the shapes come from each run).
    pub fn new(file: ModelFile, options: ImportOptions) -> Result<OnnxModel> {
        let program = OnnxProgram::new(&file)?;
        Ok(OnnxModel { file, options, program, cache: Mutex::new(Vec::new()), max_memory: Mutex::new(None) })
    }

    /// The graph inputs a run takes, in order (inputs fixed by `constants` left out).
    pub fn inputs(&self) -> Vec<&InputSpec> {
        self.program.inputs().iter().filter(|s| !self.options.constants.contains_key(&s.name)).collect()
    }

    /// Sets the memory limit of every run (see `GraphModule::set_max_memory`).
    pub fn set_max_memory(&self, bytes: Option<u64>) {
        *self.max_memory.lock().unwrap_or_else(|e| e.into_inner()) = bytes;
        for (_, gm) in self.cache.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            gm.set_max_memory(bytes);
        }
    }

    /// The input-shape signatures specialised so far, least recently used first.
    pub fn specialisations(&self) -> Vec<Vec<Vec<usize>>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, _)| k.clone()).collect()
    }

    /// The GraphModule for inputs of `shapes` (imported now if this signature is new).
    pub fn specialise(&self, shapes: &[Vec<usize>]) -> Result<Arc<GraphModule>> {
        let specs = self.inputs();
        if shapes.len() != specs.len() {
            return Err(Error::argument(
                "onnx",
                format!(
                    "the model takes {} input(s) ({}), got {}",
                    specs.len(),
                    specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", "),
                    shapes.len()
                ),
            ));
        }
        for (spec, shape) in specs.iter().zip(shapes) {
            let fits = shape.len() == spec.shape.len()
                && shape.iter().zip(&spec.shape).all(|(a, b)| b.is_none_or(|b| b == *a));
            if !fits {
                return Err(Error::shape(
                    "onnx",
                    format!(
                        "input `{}` has shape {shape:?}, but the model declares {} (None: any size)",
                        spec.name,
                        fmt_declared(&spec.shape)
                    ),
                ));
            }
        }
        let key: Vec<Vec<usize>> = shapes.to_vec();
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = cache.iter().position(|(k, _)| *k == key) {
            let entry = cache.remove(i);
            let gm = entry.1.clone();
            cache.push(entry);
            return Ok(gm);
        }
        let mut opts = self.options.clone();
        for (spec, shape) in specs.iter().zip(shapes) {
            opts.input_shapes.insert(spec.name.clone(), shape.clone());
        }
        let imported = import_model(&self.file, &opts).map_err(|e| {
            e.with_context(&format!("specialising the model to input shapes {shapes:?} at its first run"))
        })?;
        let max = *self.max_memory.lock().unwrap_or_else(|e| e.into_inner());
        if max.is_some() {
            imported.module.set_max_memory(max);
        }
        let gm = Arc::new(imported.module);
        if cache.len() >= MAX_SPECIALISATIONS {
            cache.remove(0);
        }
        cache.push((key, gm.clone()));
        Ok(gm)
    }
}

fn fmt_declared(shape: &[Option<usize>]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.map_or("None".to_string(), |d| d.to_string())).collect();
    format!("[{}]", dims.join(", "))
}

impl ModuleStructure for OnnxModel {
    fn type_name(&self) -> &'static str {
        "OnnxModel"
    }
    fn visit_tensors(&self, f: &mut dyn FnMut(&str, TensorKind, &Tensor)) {
        self.program.visit_tensors(f);
    }
    fn visit_tensors_mut(&mut self, f: &mut dyn FnMut(&str, TensorKind, &mut Tensor)) {
        // specialisations captured the old tensors: import again at the next run
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.program.visit_tensors_mut(f);
    }
    fn visit_children<'a>(&'a self, _f: &mut dyn FnMut(&str, &'a dyn Module)) {}
    fn visit_children_mut(&mut self, _f: &mut dyn FnMut(&str, &mut dyn Module)) {}
    fn as_module(&self) -> &dyn Module {
        self
    }
    fn as_module_mut(&mut self) -> &mut dyn Module {
        self
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl Module for OnnxModel {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self.forward_values(&[Value::Tensor(x.clone())])?.into_iter().next() {
            Some(Value::Tensor(t)) => Ok(t),
            _ => Err(Error::argument("onnx", "the model has no tensor output")),
        }
    }
    fn forward_values(&self, inputs: &[Value]) -> Result<Vec<Value>> {
        let shapes = inputs
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::Tensor(t) => Ok(t.shape().to_vec()),
                other => Err(Error::argument("onnx", format!("input {i} must be a tensor, got {other:?}"))),
            })
            .collect::<Result<Vec<_>>>()?;
        self.specialise(&shapes)?.forward_values(inputs)
    }
}
