/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1

// Hub marks v1 as the version every other served version converts to and from
// (api/v1alpha1 implements the conversion). v1 is also the storage version.
func (*AIInference) Hub() {}
