/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
)

// Deep copies used by the conversion, so converted objects never share memory
// with their source.

func copyPtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

func copyQuantity(q *resource.Quantity) *resource.Quantity {
	if q == nil {
		return nil
	}
	c := q.DeepCopy()
	return &c
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func copyEnv(env []corev1.EnvVar) []corev1.EnvVar {
	if env == nil {
		return nil
	}
	c := make([]corev1.EnvVar, len(env))
	for i := range env {
		env[i].DeepCopyInto(&c[i])
	}
	return c
}

func copyTolerations(ts []corev1.Toleration) []corev1.Toleration {
	if ts == nil {
		return nil
	}
	c := make([]corev1.Toleration, len(ts))
	for i := range ts {
		ts[i].DeepCopyInto(&c[i])
	}
	return c
}

func copyConditions(cs []metav1.Condition) []metav1.Condition {
	if cs == nil {
		return nil
	}
	c := make([]metav1.Condition, len(cs))
	for i := range cs {
		cs[i].DeepCopyInto(&c[i])
	}
	return c
}

// copyDeep deep-copies a list of API structs, keeping nil as nil.
func copyDeep[T any, P interface {
	*T
	DeepCopyInto(*T)
}](in []T) []T {
	if in == nil {
		return nil
	}
	out := make([]T, len(in))
	for i := range in {
		P(&in[i]).DeepCopyInto(&out[i])
	}
	return out
}

func copyAdapters(as []servingv1.AdapterSpec) []servingv1.AdapterSpec { return copyDeep(as) }

func copyAdapterStatuses(as []servingv1.AdapterStatus) []servingv1.AdapterStatus {
	return copyDeep(as)
}
