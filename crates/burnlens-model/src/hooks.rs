//! Hook points: named places in the forward pass where an activation can be read
//! (cached) or replaced (intervention), under TransformerLens's names.
//!
//! A forward pass takes a `&mut Hooks`. [`Hooks::none`] does nothing and costs nothing.

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

type PointFilter<'a> = Box<dyn Fn(HookPoint) -> bool + 'a>;
type Edit<'a> = Box<dyn FnMut(HookPoint, Activation) -> Activation + 'a>;

/// What a forward pass does at its hook points: which activations to keep, and which to
/// replace. Points are typed throughout; names appear only where a user spells them (see
/// [`HookPoint::parse`] and [`named`]).
#[derive(Default)]
pub struct Hooks<'a> {
    capture: Option<PointFilter<'a>>,
    edits: Vec<(PointFilter<'a>, Edit<'a>)>,
    /// Whether only the parts whose points are hooked are written out
    /// ([`Hooks::fusing_unhooked`]).
    fuse_unhooked: bool,
    /// Captured activations by hook point.
    pub cache: BTreeMap<HookPoint, Activation>,
}

impl<'a> Hooks<'a> {
    /// No capture, no intervention.
    pub fn none() -> Self {
        Self::default()
    }

    /// Keep every activation at a point `filter` accepts.
    pub fn capture(filter: impl Fn(HookPoint) -> bool + 'a) -> Self {
        Self { capture: Some(Box::new(filter)), ..Self::default() }
    }

    /// Keep exactly the activations at `points`.
    pub fn capture_points(points: &'a [HookPoint]) -> Self {
        Self::capture(move |p| points.contains(&p))
    }

    /// Also replace the activation at every point `filter` accepts by what `edit` returns
    /// (it must keep the shape). Edits run in the order they were added, and the cache holds
    /// the edited value, the one the rest of the model sees.
    pub fn with_edit(mut self, filter: impl Fn(HookPoint) -> bool + 'a, edit: impl FnMut(HookPoint, Activation) -> Activation + 'a) -> Self {
        self.edits.push((Box::new(filter), Box::new(edit)));
        self
    }

    /// Let a part of the model (a layer's attention, a norm) none of whose points is hooked
    /// keep its fused computation (attention's pattern never materialised), for a pass that
    /// reads a few points only (the activation store, the dashboards). Without it every part
    /// is written out while any hook is active, so that runs compared with each other
    /// (patching a run with itself) take the same arithmetic everywhere.
    pub fn fusing_unhooked(mut self) -> Self {
        self.fuse_unhooked = true;
        self
    }

    /// Whether the part of the model that owns `points` must be written out, every point on
    /// the way a tensor: see [`Hooks::fusing_unhooked`].
    pub fn writes_out(&self, points: impl IntoIterator<Item = HookPoint>) -> bool {
        self.is_active() && (!self.fuse_unhooked || points.into_iter().any(|p| self.wants(p)))
    }

    /// Whether any point can be observed or changed.
    #[inline]
    pub fn is_active(&self) -> bool {
        self.capture.is_some() || !self.edits.is_empty()
    }

    /// Whether the activation at `point` would be captured or edited; lets the model skip
    /// computing optional activations (such as per-head results) nobody asked for.
    pub fn wants(&self, point: HookPoint) -> bool {
        self.capture.as_ref().is_some_and(|f| f(point)) || self.edits.iter().any(|(f, _)| f(point))
    }

    /// Pass `tensor` through hook point `point`.
    #[inline]
    pub fn at<T: Hookable + Clone>(&mut self, point: HookPoint, tensor: T) -> T {
        if !self.is_active() {
            return tensor;
        }
        let mut tensor = tensor;
        for (filter, edit) in self.edits.iter_mut() {
            if filter(point) {
                let before = tensor.into_activation();
                let dims = before.dims();
                let after = edit(point, before);
                assert_eq!(after.dims(), dims, "an intervention at `{point}` changed the activation's shape");
                tensor = T::from_activation(after).unwrap_or_else(|| panic!("an intervention at `{point}` changed the activation's rank"));
            }
        }
        if self.capture.as_ref().is_some_and(|f| f(point)) {
            self.cache.insert(point, tensor.clone().into_activation());
        }
        tensor
    }

    /// Remove and return the captured activations.
    pub fn take_cache(&mut self) -> BTreeMap<HookPoint, Activation> {
        std::mem::take(&mut self.cache)
    }
}

/// A cache keyed by TransformerLens's names, for the edges that speak names (Python, files,
/// the CLI's output).
pub fn named<V>(cache: BTreeMap<HookPoint, V>) -> BTreeMap<String, V> {
    cache.into_iter().map(|(p, v)| (p.name(), v)).collect()
}
