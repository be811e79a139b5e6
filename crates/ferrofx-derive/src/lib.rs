//! `#[derive(Module)]` for ferrofx-nn.
//!
//! The derive implements `ferrofx_nn::ModuleStructure` for a struct with named fields: it
//! discovers parameters, buffers and child modules from the fields, so that the user only writes
//! `forward` (in `impl ferrofx_nn::Module for MyNet`). See `ferrofx_nn::ModuleStructure` for the rules;
//! in short:
//!
//! * a field whose type implements `ferrofx_nn::ModuleField` is visited under its field name:
//!   `Tensor` (a parameter), `Option<Tensor>`, any `Module` (a child), `Vec<_>` (elements named
//!   `field.0`, `field.1`, ...), `Option<_>`, `Box<dyn Module>`;
//! * every other field (sizes, flags, strings, configuration structs) is ignored automatically,
//!   except fields whose type mentions a generic parameter: those must implement `ModuleField`
//!   (bound the parameter by `Module`) or be `#[module(skip)]`ped;
//! * `#[module(buffer)]` makes a `Tensor`/`Option<Tensor>` field a buffer;
//! * `#[module(skip)]` ignores a field that would otherwise be visited;
//! * `#[module(rename = "0")]` uses another name in qualified paths and state dict keys;
//! * a field `training: bool` holds the module's own training flag (`train()`/`eval()` set it);
//! * `#[module(name = "Conv2d")]` on the struct sets `type_name()` (default: the struct name).

use proc_macro::TokenStream;
use quote::quote;
use syn::{parse_macro_input, Data, DeriveInput, Fields, LitStr};

/// Derives `ferrofx_nn::ModuleStructure`. See the crate documentation.
#[proc_macro_derive(Module, attributes(module))]
pub fn derive_module(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(input) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

#[derive(Default)]
struct FieldAttrs {
    skip: bool,
    buffer: bool,
    rename: Option<String>,
}

fn field_attrs(attrs: &[syn::Attribute]) -> syn::Result<FieldAttrs> {
    let mut out = FieldAttrs::default();
    for attr in attrs.iter().filter(|a| a.path().is_ident("module")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("skip") {
                out.skip = true;
                Ok(())
            } else if meta.path.is_ident("buffer") {
                out.buffer = true;
                Ok(())
            } else if meta.path.is_ident("rename") {
                let s: LitStr = meta.value()?.parse()?;
                out.rename = Some(s.value());
                Ok(())
            } else {
                Err(meta
                    .error("unknown #[module(...)] field attribute; expected `skip`, `buffer` or `rename = \"...\"`"))
            }
        })?;
    }
    if out.skip && (out.buffer || out.rename.is_some()) {
        return Err(syn::Error::new_spanned(&attrs[0], "#[module(skip)] cannot be combined with `buffer` or `rename`"));
    }
    Ok(out)
}

fn expand(input: DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let name = &input.ident;
    let mut type_name = name.to_string();
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("module")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("name") {
                let s: LitStr = meta.value()?.parse()?;
                type_name = s.value();
                Ok(())
            } else {
                Err(meta.error("unknown #[module(...)] struct attribute; expected `name = \"...\"`"))
            }
        })?;
    }
    let fields = match &input.data {
        Data::Struct(s) => match &s.fields {
            Fields::Named(f) => f.named.iter().collect::<Vec<_>>(),
            Fields::Unit => Vec::new(),
            Fields::Unnamed(_) => {
                return Err(syn::Error::new_spanned(name, "#[derive(Module)] needs a struct with named fields"))
            }
        },
        _ => return Err(syn::Error::new_spanned(name, "#[derive(Module)] supports structs only")),
    };

    let params: Vec<String> = input.generics.type_params().map(|t| t.ident.to_string()).collect();
    let krate = quote!(::ferrofx_nn);
    let p = quote!(#krate::__private);
    let mut tensors = Vec::new();
    let mut tensors_mut = Vec::new();
    let mut children = Vec::new();
    let mut children_mut = Vec::new();
    let mut training = None;
    for f in &fields {
        let ident = f.ident.as_ref().expect("named field");
        let a = field_attrs(&f.attrs)?;
        if a.skip {
            continue;
        }
        if ident == "training" && a.rename.is_none() && !a.buffer {
            if let syn::Type::Path(tp) = &f.ty {
                if tp.path.is_ident("bool") {
                    training = Some(ident.clone());
                    continue;
                }
            }
        }
        let key = a.rename.clone().unwrap_or_else(|| ident.to_string().trim_start_matches("r#").to_string());
        if a.buffer {
            tensors.push(quote! { #p::visit_buffer(&self.#ident, #key, f); });
            tensors_mut.push(quote! { #p::visit_buffer_mut(&mut self.#ident, #key, f); });
        } else if mentions_param(&f.ty, &params) {
            // Autoref dispatch cannot see through generic parameters: call ModuleField directly
            // (the parameter must then be bounded by `Module`/`ModuleField`, or the field skipped).
            let mf = quote!(#krate::ModuleField);
            tensors.push(quote! { #mf::visit_field_tensors(&self.#ident, #key, #krate::TensorKind::Parameter, f); });
            tensors_mut.push(
                quote! { #mf::visit_field_tensors_mut(&mut self.#ident, #key, #krate::TensorKind::Parameter, f); },
            );
            children.push(quote! { #mf::visit_field_children(&self.#ident, #key, f); });
            children_mut.push(quote! { #mf::visit_field_children_mut(&mut self.#ident, #key, f); });
        } else {
            tensors.push(quote! { (&&#p::Field(&self.#ident)).__tensors(#key, f); });
            tensors_mut.push(quote! { (&&#p::FieldMut::new(&mut self.#ident)).__tensors_mut(#key, f); });
            children.push(quote! { (&&#p::Field(&self.#ident)).__children(#key, f); });
            children_mut.push(quote! { (&&#p::FieldMut::new(&mut self.#ident)).__children_mut(#key, f); });
        }
    }
    let training_impl = match training {
        Some(t) => quote! {
            fn local_training(&self) -> ::core::option::Option<bool> { ::core::option::Option::Some(self.#t) }
            fn set_local_training(&mut self, mode: bool) { self.#t = mode; }
        },
        None => quote! {},
    };
    let (ig, tg, wc) = input.generics.split_for_impl();
    Ok(quote! {
        #[automatically_derived]
        #[allow(unused_variables, unused_imports)]
        impl #ig #krate::ModuleStructure for #name #tg #wc {
            fn type_name(&self) -> &'static str { #type_name }
            fn visit_tensors(&self, f: &mut dyn FnMut(&str, #krate::TensorKind, &#krate::Tensor)) {
                use #p::{ViaField as _, ViaIgnore as _};
                #(#tensors)*
            }
            fn visit_tensors_mut(&mut self, f: &mut dyn FnMut(&str, #krate::TensorKind, &mut #krate::Tensor)) {
                use #p::{ViaFieldMut as _, ViaIgnoreMut as _};
                #(#tensors_mut)*
            }
            fn visit_children<'__a>(&'__a self, f: &mut dyn FnMut(&str, &'__a dyn #krate::Module)) {
                use #p::{ViaField as _, ViaIgnore as _};
                #(#children)*
            }
            fn visit_children_mut(&mut self, f: &mut dyn FnMut(&str, &mut dyn #krate::Module)) {
                use #p::{ViaFieldMut as _, ViaIgnoreMut as _};
                #(#children_mut)*
            }
            #training_impl
            fn as_module(&self) -> &dyn #krate::Module { self }
            fn as_module_mut(&mut self) -> &mut dyn #krate::Module { self }
            fn as_any(&self) -> &dyn ::core::any::Any { self }
            fn as_any_mut(&mut self) -> &mut dyn ::core::any::Any { self }
        }
    })
}

fn mentions_param(ty: &syn::Type, params: &[String]) -> bool {
    if params.is_empty() {
        return false;
    }
    let text = quote!(#ty).to_string();
    text.split(|c: char| !(c.is_alphanumeric() || c == '_')).any(|w| params.iter().any(|p| p == w))
}
