//! Hook points: named places in the forward pass where an activation can be read
//! (cached) or replaced (intervention), under TransformerLens's names.
//!
//! A forward pass takes a `&mut Hooks`. [`Hooks::none`] does nothing and costs nothing: the
//! name of a hook point is only formatted when something might want it.

use std::collections::BTreeMap;

use burn::tensor::Tensor;

use crate::HookPoint;

/// An activation captured at a hook point. Ranks differ by point: the residual stream is
/// `[batch, pos, d_model]`, per-head tensors are rank 4.
#[derive(Debug, Clone)]
pub enum Activation {
    /// `[batch, pos, d]` tensors.
    Rank3(Tensor<3>),
    /// `[batch, pos, head, d_head]`, `[batch, head, query, key]` or `[batch, pos, head, d_model]`.
    Rank4(Tensor<4>),
}

impl Activation {
    /// The tensor's shape.
    pub fn dims(&self) -> Vec<usize> {
        match self {
            Activation::Rank3(t) => t.dims().to_vec(),
            Activation::Rank4(t) => t.dims().to_vec(),
        }
    }

    /// Copy the values to the host as `f32`, row-major.
    pub fn to_vec(&self) -> Vec<f32> {
        let data = match self {
            Activation::Rank3(t) => t.to_data(),
            Activation::Rank4(t) => t.to_data(),
        };
        data.try_into_vec_as::<f32>().expect("activation converts to f32")
    }

    /// The rank-3 tensor, if this is one.
    pub fn rank3(&self) -> Option<Tensor<3>> {
        match self {
            Activation::Rank3(t) => Some(t.clone()),
            _ => None,
        }
    }

    /// The rank-4 tensor, if this is one.
    pub fn rank4(&self) -> Option<Tensor<4>> {
        match self {
            Activation::Rank4(t) => Some(t.clone()),
            _ => None,
        }
    }
}

/// Tensors that can pass through a hook point.
pub trait Hookable: Sized {
    /// Wrap as an [`Activation`].
    fn into_activation(self) -> Activation;
    /// Unwrap; `None` if an intervention returned a tensor of another rank.
    fn from_activation(a: Activation) -> Option<Self>;
}

impl Hookable for Tensor<3> {
    fn into_activation(self) -> Activation {
        Activation::Rank3(self)
    }
    fn from_activation(a: Activation) -> Option<Self> {
        match a {
            Activation::Rank3(t) => Some(t),
            _ => None,
        }
    }
}

impl Hookable for Tensor<4> {
    fn into_activation(self) -> Activation {
        Activation::Rank4(self)
    }
    fn from_activation(a: Activation) -> Option<Self> {
        match a {
            Activation::Rank4(t) => Some(t),
            _ => None,
        }
    }
}

type NameFilter<'a> = Box<dyn Fn(&str) -> bool + 'a>;
type Edit<'a> = Box<dyn FnMut(&str, Activation) -> Activation + 'a>;

/// What a forward pass does at its hook points: which activations to keep, and which to
/// replace.
#[derive(Default)]
pub struct Hooks<'a> {
    capture: Option<NameFilter<'a>>,
    edits: Vec<(NameFilter<'a>, Edit<'a>)>,
    /// Captured activations by hook name.
    pub cache: BTreeMap<String, Activation>,
}

impl<'a> Hooks<'a> {
    /// No capture, no intervention.
    pub fn none() -> Self {
        Self::default()
    }

    /// Keep every activation whose name satisfies `filter`.
    pub fn capture(filter: impl Fn(&str) -> bool + 'a) -> Self {
        Self { capture: Some(Box::new(filter)), ..Self::default() }
    }

    /// Keep exactly the activations named in `names`.
    pub fn capture_names(names: &'a [&'a str]) -> Self {
        Self::capture(move |n| names.contains(&n))
    }

    /// Also replace the activation at every point whose name satisfies `filter` by what
    /// `edit` returns (it must keep the shape). Edits run in the order they were added, and
    /// the cache holds the edited value, the one the rest of the model sees.
    pub fn with_edit(mut self, filter: impl Fn(&str) -> bool + 'a, edit: impl FnMut(&str, Activation) -> Activation + 'a) -> Self {
        self.edits.push((Box::new(filter), Box::new(edit)));
        self
    }

    /// Whether any point can be observed or changed.
    #[inline]
    pub fn is_active(&self) -> bool {
        self.capture.is_some() || !self.edits.is_empty()
    }

    /// Whether the activation `name` would be captured; lets the model skip computing
    /// optional activations (such as per-head results) nobody asked for.
    pub fn wants(&self, name: &str) -> bool {
        self.capture.as_ref().is_some_and(|f| f(name)) || self.edits.iter().any(|(f, _)| f(name))
    }

    /// Pass `tensor` through hook point `point` (named only when something might want it).
    #[inline]
    pub fn at<T: Hookable + Clone>(&mut self, point: HookPoint, tensor: T) -> T {
        self.point(|| point.name(), tensor)
    }

    /// Whether hook point `point` would be captured or edited ([`wants`](Self::wants)).
    pub fn wants_point(&self, point: HookPoint) -> bool {
        self.is_active() && self.wants(&point.name())
    }

    /// Pass `tensor` through the hook point called `name()`.
    #[inline]
    pub fn point<T: Hookable + Clone>(&mut self, name: impl FnOnce() -> String, tensor: T) -> T {
        if !self.is_active() {
            return tensor;
        }
        self.point_named(&name(), tensor)
    }

    fn point_named<T: Hookable + Clone>(&mut self, name: &str, tensor: T) -> T {
        let mut tensor = tensor;
        for (filter, edit) in self.edits.iter_mut() {
            if filter(name) {
                let before = tensor.into_activation();
                let dims = before.dims();
                let after = edit(name, before);
                assert_eq!(after.dims(), dims, "an intervention at `{name}` changed the activation's shape");
                tensor = T::from_activation(after).unwrap_or_else(|| panic!("an intervention at `{name}` changed the activation's rank"));
            }
        }
        if self.capture.as_ref().is_some_and(|f| f(name)) {
            self.cache.insert(name.to_string(), tensor.clone().into_activation());
        }
        tensor
    }

    /// Remove and return the captured activations.
    pub fn take_cache(&mut self) -> BTreeMap<String, Activation> {
        std::mem::take(&mut self.cache)
    }
}
