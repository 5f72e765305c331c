package aiinference

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// applyResult is what apply found and did.
type applyResult int

const (
	// applyCreated: the child did not exist and was created.
	applyCreated applyResult = iota
	// applyUnchanged: the child exists as desired; nothing was written.
	applyUnchanged
	// applyUpdated: the child existed and was brought back to the desired state.
	applyUpdated
	// applyConflict: an object of that name exists and this AIInference does not
	// control it; it was left alone.
	applyConflict
)

// apply writes a child with server-side apply, owned by the AIInference, unless it
// exists as desired: a pass with nothing to change makes no write, while a child
// edited by hand is put back. An object of the same name that the AIInference does
// not control is never written (adopting it would let the garbage collector delete
// it with the AIInference); the conflict is recorded for status. existing is
// filled with the object found, if any.
func (r *Reconciler) apply(ctx context.Context, s *scope, desired, existing client.Object) (applyResult, error) {
	res, err := r.applyChild(ctx, s, desired, existing)
	recordApply(ctx, desired, res, err)
	return res, err
}

func (r *Reconciler) applyChild(ctx context.Context, s *scope, desired, existing client.Object) (applyResult, error) {
	hash := hashOf(desired)
	annotations := desired.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[servingv1.AnnotationSpecHash] = hash
	desired.SetAnnotations(annotations)
	if err := controllerutil.SetControllerReference(s.obj, desired, r.Scheme); err != nil {
		return 0, err
	}
	kind := desired.GetObjectKind().GroupVersionKind().Kind
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(desired)
	if err != nil {
		return 0, fmt.Errorf("converting %s: %w", kind, err)
	}
	delete(content, "status")
	key := client.ObjectKeyFromObject(desired)

	found, err := r.getCached(ctx, key, existing)
	if err == nil && !found {
		// The cache holds every object with the operator's label: a miss means the
		// operator never wrote this child, or an object of that name is someone
		// else's. Create it without reading first; only an object in the way costs
		// the read that tells whose it is.
		created, cerr := r.createOnly(ctx, s, kind, content)
		if cerr != nil || created {
			return applyCreated, cerr
		}
		found, err = r.getUncached(ctx, key, existing)
	}
	if err != nil {
		return 0, fmt.Errorf("reading %s %s: %w", kind, desired.GetName(), err)
	}
	if d, ok := existing.(*appsv1.Deployment); ok && found && podSpecDropped(d) && d.Annotations[servingv1.AnnotationSpecHash] == hash {
		// The desired spec is the one last written: unchanged unless someone
		// else wrote the spec since, which only its full copy can tell.
		if r.verified.matches(d) {
			return applyUnchanged, nil
		}
		if found, err = r.getUncached(ctx, key, existing); err != nil {
			return 0, fmt.Errorf("reading %s %s: %w", kind, desired.GetName(), err)
		} else if !found {
			return 0, fmt.Errorf("%s %s went away while being read; looking again", kind, desired.GetName())
		}
	}
	result, drifted := applyCreated, false
	var added [][]string
	if found {
		if !metav1.IsControlledBy(existing, s.obj) {
			s.noteConflict(kind, &problem{servingv1.ReasonNameConflict, fmt.Sprintf(
				"%s %q already exists and is not controlled by this AIInference; the operator leaves it alone. Rename or delete that %s, or give the AIInference another name",
				kind, desired.GetName(), kind)})
			return applyConflict, nil
		}
		var covered bool
		covered, added, err = covers(existing, desired)
		if err != nil || (covered && existing.GetAnnotations()[servingv1.AnnotationSpecHash] == hash) {
			if err == nil {
				r.noteVerified(existing)
			}
			return applyUnchanged, err
		}
		// Edited by hand: the operator's desired state did not change, the child did.
		result, drifted = applyUpdated, !covered && existing.GetAnnotations()[servingv1.AnnotationSpecHash] == hash
	}

	ctrl.LoggerFrom(ctx).Info("Applying "+kind, kind, klog.KObj(desired), "editedByHand", drifted)
	if drifted {
		// Server-side apply keeps what other field managers set: a Service port
		// added by kubectl edit would stay beside ours, as ports are keyed by
		// number. A JSON merge patch replaces the desired fields whole, lists
		// included. (Not on a change of the desired state: a merge patch leaves map
		// keys the operator no longer sets, which only the apply removes, and two
		// different writes of a pod template would start two rollouts.)
		if err := r.mergeDesired(ctx, content, added, existing); err != nil {
			return 0, fmt.Errorf("restoring %s %s: %w", kind, desired.GetName(), err)
		}
	}
	u := &unstructured.Unstructured{Object: content}
	if err := r.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return 0, fmt.Errorf("applying %s %s: %w", kind, desired.GetName(), err)
	}
	r.noteVerified(u) // the API server's answer: the applied object
	// The applied spec is new: whatever status was observed describes the old one.
	s.noteChange()
	return result, nil
}

// createOnlyVersion is a resourceVersion no object has (etcd's first write
// already takes revision 2): a server-side apply that carries it creates the
// object when it is absent, and fails with a conflict, writing nothing, when
// an object of that name exists. (A UID in the apply does not work: the API
// server refuses to create an object whose UID the request names. A POST would,
// but its fields would belong to an Update manager that later applies never
// remove.)
const createOnlyVersion = "1"

// createOnly creates a child with a server-side apply that cannot touch an
// existing object; false (and no error) when one is in the way.
func (r *Reconciler) createOnly(ctx context.Context, s *scope, kind string, content map[string]any) (bool, error) {
	u := (&unstructured.Unstructured{Object: content}).DeepCopy()
	u.SetResourceVersion(createOnlyVersion)
	ctrl.LoggerFrom(ctx).Info("Creating "+kind, kind, klog.KObj(u))
	err := r.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldOwner), client.ForceOwnership)
	switch {
	case apierrors.IsConflict(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("creating %s %s: %w", kind, u.GetName(), err)
	}
	r.noteVerified(u)
	s.noteChange()
	return true, nil
}

// noteVerified remembers the generation of a Deployment whose full spec the
// operator wrote or compared: the desired one.
func (r *Reconciler) noteVerified(obj client.Object) {
	if _, typed := obj.(*appsv1.Deployment); typed || obj.GetObjectKind().GroupVersionKind().Kind == "Deployment" {
		r.verified.record(client.ObjectKeyFromObject(obj), obj.GetUID(), obj.GetGeneration())
	}
}

// getCached reads a child from the cache, which holds only objects with the
// operator's label.
func (r *Reconciler) getCached(ctx context.Context, key client.ObjectKey, obj client.Object) (bool, error) {
	err := r.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// getUncached reads an object from the API server: one of the same name as a
// child that the cache does not hold (a user's), or a child written so
// recently that the cache has not seen it yet.
func (r *Reconciler) getUncached(ctx context.Context, key client.ObjectKey, obj client.Object) (bool, error) {
	err := r.APIReader.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// getChild reads a child from the cache, and on a miss from the API server: the
// cache holds only objects with the operator's label, so a user's object of the
// same name is only found there.
func (r *Reconciler) getChild(ctx context.Context, key client.ObjectKey, obj client.Object) (bool, error) {
	found, err := r.getCached(ctx, key, obj)
	if err != nil || found {
		return found, err
	}
	return r.getUncached(ctx, key, obj)
}

// mergeDesired writes the desired spec or data over an existing child with a
// JSON merge patch, removing the keys added by hand to its exact maps (a merge
// patch keeps a map's other keys, and replaces lists whole).
func (r *Reconciler) mergeDesired(ctx context.Context, desired map[string]any, added [][]string, existing client.Object) error {
	patch := map[string]any{}
	for _, field := range []string{"spec", "data"} {
		if v, ok := desired[field]; ok {
			patch[field] = runtime.DeepCopyJSONValue(v)
		}
	}
	for _, path := range added {
		_ = unstructured.SetNestedField(patch, nil, path...)
	}
	body, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	return r.Patch(ctx, existing, client.RawPatch(types.MergePatchType, body), client.FieldOwner(FieldOwner))
}

// covers tells whether the existing child holds everything desired sets in its
// metadata (labels, annotations, owner) and its spec or data, and nothing more in
// its exact maps. Fields the API server or other controllers add are ignored, as
// are fields desired leaves empty. added are the paths of keys found in exact
// maps outside lists, which a merge patch must remove by name.
func covers(existing, desired client.Object) (covered bool, added [][]string, err error) {
	have, err := runtime.DefaultUnstructuredConverter.ToUnstructured(existing)
	if err != nil {
		return false, nil, err
	}
	want, err := runtime.DefaultUnstructuredConverter.ToUnstructured(desired)
	if err != nil {
		return false, nil, err
	}
	extra := false
	kind := kindOf(desired.GetObjectKind().GroupVersionKind().Kind)
	for _, path := range kind.exactMaps {
		extra = addedKeys(have, want, path, []string{}, &added) || extra
	}
	if kind.exactSpec {
		extra = addedFields(have["spec"], want["spec"], []string{"spec"}, &added) || extra
	}
	for _, field := range []string{"spec", "data"} {
		if !subset(have[field], want[field]) {
			return false, added, nil
		}
	}
	haveMeta, _ := have["metadata"].(map[string]any)
	wantMeta, _ := want["metadata"].(map[string]any)
	for _, field := range []string{"labels", "annotations", "ownerReferences"} {
		if !subset(haveMeta[field], wantMeta[field]) {
			return false, added, nil
		}
	}
	return !extra, added, nil
}

// addedFields tells whether have holds a field that want lacks, at any depth,
// and appends the paths of those outside lists to added (a merge patch
// replaces a list whole). at is the path walked so far, nil once inside a list.
func addedFields(have, want any, at []string, added *[][]string) bool {
	found := false
	switch h := have.(type) {
	case map[string]any:
		w, _ := want.(map[string]any)
		for k, v := range h {
			var next []string
			if at != nil {
				next = append(slices.Clone(at), k)
			}
			wv, ok := w[k]
			if !ok {
				found = true
				if next != nil {
					*added = append(*added, next)
				}
				continue
			}
			found = addedFields(v, wv, next, added) || found
		}
	case []any:
		w, _ := want.([]any)
		for i := range min(len(h), len(w)) {
			found = addedFields(h[i], w[i], nil, added) || found
		}
	}
	return found
}

// addedKeys tells whether the map at path in have holds keys that want's lacks,
// and appends the paths of those outside lists to added (inside a list, the
// merge patch replaces the whole list). at is the path walked so far, nil once
// inside a list.
func addedKeys(have, want any, path, at []string, added *[][]string) bool {
	if len(path) == 0 {
		h, _ := have.(map[string]any)
		w, _ := want.(map[string]any)
		found := false
		for k := range h {
			if _, ok := w[k]; !ok {
				found = true
				if at != nil {
					*added = append(*added, append(slices.Clone(at), k))
				}
			}
		}
		return found
	}
	if path[0] == "*" {
		h, _ := have.([]any)
		w, _ := want.([]any)
		found := false
		for _, item := range w {
			m, ok := item.(map[string]any)
			if !ok {
				continue
			}
			found = addedKeys(findNamed(h, m["name"]), item, path[1:], nil, added) || found
		}
		return found
	}
	h, _ := have.(map[string]any)
	w, _ := want.(map[string]any)
	if at != nil {
		at = append(slices.Clone(at), path[0])
	}
	return addedKeys(h[path[0]], w[path[0]], path[1:], at, added)
}

// subset tells whether have holds want: maps key by key, lists of named items
// (containers, ports, env, volumes) by name, other lists item by item.
func subset(have, want any) bool {
	switch w := want.(type) {
	case nil:
		return true
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return len(w) == 0
		}
		for k, v := range w {
			if !subset(h[k], v) {
				return false
			}
		}
		return true
	case []any:
		h, _ := have.([]any)
		if len(w) == 0 {
			return true
		}
		if named(w) && named(h) {
			for _, item := range w {
				if !subset(findNamed(h, item.(map[string]any)["name"]), item) {
					return false
				}
			}
			return len(h) == len(w)
		}
		if len(h) != len(w) {
			return false
		}
		for i := range w {
			if !subset(h[i], w[i]) {
				return false
			}
		}
		return true
	}
	if reflect.ValueOf(want).IsZero() {
		return true // left empty: whatever the API server defaulted is fine
	}
	return reflect.DeepEqual(have, want)
}

// named tells whether every item of a list is a map with a name.
func named(list []any) bool {
	for _, item := range list {
		m, ok := item.(map[string]any)
		if !ok {
			return false
		}
		if _, ok := m["name"]; !ok {
			return false
		}
	}
	return len(list) > 0
}

func findNamed(list []any, name any) any {
	for _, item := range list {
		if item.(map[string]any)["name"] == name {
			return item
		}
	}
	return nil
}

// deleteOwned deletes a child the spec no longer asks for, if this AIInference
// controls it; anything else of that name is left alone. Only the cache is read:
// it holds every child the operator made, so a pass with nothing to remove
// costs no request.
func (r *Reconciler) deleteOwned(ctx context.Context, s *scope, desired, existing client.Object) error {
	if err := r.Get(ctx, client.ObjectKeyFromObject(desired), existing); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return nil
		}
		return fmt.Errorf("reading %s %s: %w", desired.GetObjectKind().GroupVersionKind().Kind, desired.GetName(), err)
	}
	if !metav1.IsControlledBy(existing, s.obj) || !existing.GetDeletionTimestamp().IsZero() {
		return nil
	}
	kind := desired.GetObjectKind().GroupVersionKind().Kind
	ctrl.LoggerFrom(ctx).Info("Deleting "+kind+" the spec no longer asks for", kind, klog.KObj(existing))
	uid := existing.GetUID()
	switch err := r.Delete(ctx, existing, client.Preconditions{UID: &uid}); {
	case err == nil:
		s.noteChange()
	case !apierrors.IsNotFound(err) && !apierrors.IsConflict(err):
		return fmt.Errorf("deleting %s %s: %w", kind, existing.GetName(), err)
	}
	return nil
}
