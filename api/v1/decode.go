/*
Copyright 2026 The AIInference Operator Authors.

Licensed under the Apache License, Version 2.0.
*/

package v1

import (
	"encoding/json"
	"fmt"

	kjson "sigs.k8s.io/json"
)

// UnmarshalJSON reads an AIInference, and one whose spec cannot be read as v1
// too: its metadata and status, with the reason in DecodeError. Such an object
// was stored in another form without conversion (a v1alpha1 object written
// while no conversion webhook ran, whose spec.engine is a string). Failing the
// decode instead would fail every list and watch that holds it, so the
// operator would see no object at all, and this one could not be told why.
func (in *AIInference) UnmarshalJSON(data []byte) error {
	type plain AIInference // the same fields, without this method
	// Case-sensitive, as the API machinery's own decoder is.
	err := kjson.UnmarshalCaseSensitivePreserveInts(data, (*plain)(in))
	if err == nil {
		in.UnreadableSpec = ""
		return nil
	}
	var readable struct {
		Kind       string            `json:"kind"`
		APIVersion string            `json:"apiVersion"`
		Metadata   json.RawMessage   `json:"metadata"`
		Status     AIInferenceStatus `json:"status"`
	}
	if kjson.UnmarshalCaseSensitivePreserveInts(data, &readable) != nil {
		return err
	}
	*in = AIInference{Status: readable.Status}
	in.Kind, in.APIVersion = readable.Kind, readable.APIVersion
	if len(readable.Metadata) > 0 {
		if kjson.UnmarshalCaseSensitivePreserveInts(readable.Metadata, &in.ObjectMeta) != nil {
			return err
		}
	}
	in.UnreadableSpec = fmt.Sprintf("the stored spec cannot be read as %s: %v", GroupVersion, err)
	return nil
}

// DecodeError says why the object's spec could not be read; "" when it could.
// An object with one has an empty Spec and must not be acted on.
func (in *AIInference) DecodeError() string { return in.UnreadableSpec }
