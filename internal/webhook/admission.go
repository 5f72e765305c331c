package webhook

import (
	"context"
	"errors"
	"fmt"

	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	"sigs.k8s.io/controller-runtime/pkg/webhook/conversion"

	servingv1 "github.com/aiinference/operator/api/v1"
	servingv1alpha1 "github.com/aiinference/operator/api/v1alpha1"
	"github.com/aiinference/operator/internal/engine"
)

// Paths the webhooks are served at; config/webhook/manifests.yaml (generated from
// the markers below) and the CRD's conversion patch point at them.
const (
	DefaultPath          = "/mutate-serving-aiinference-io-v1-aiinference"
	ValidateV1Path       = "/validate-serving-aiinference-io-v1-aiinference"
	ValidateV1Alpha1Path = "/validate-serving-aiinference-io-v1alpha1-aiinference"
	ConvertPath          = "/convert"
)

// The defaulting webhook is registered for v1 only with matchPolicy Equivalent:
// the API server converts a v1alpha1 request to v1 for it and back. Each version
// has its own validating webhook (matchPolicy Exact), so that messages name the
// fields as the user wrote them.
// +kubebuilder:webhook:path=/mutate-serving-aiinference-io-v1-aiinference,mutating=true,failurePolicy=fail,sideEffects=None,groups=serving.aiinference.io,resources=aiinferences,verbs=create;update,versions=v1,name=default.aiinferences.serving.aiinference.io,admissionReviewVersions=v1,matchPolicy=Equivalent
// +kubebuilder:webhook:path=/validate-serving-aiinference-io-v1-aiinference,mutating=false,failurePolicy=fail,sideEffects=None,groups=serving.aiinference.io,resources=aiinferences,verbs=create;update,versions=v1,name=validate-v1.aiinferences.serving.aiinference.io,admissionReviewVersions=v1,matchPolicy=Exact
// +kubebuilder:webhook:path=/validate-serving-aiinference-io-v1alpha1-aiinference,mutating=false,failurePolicy=fail,sideEffects=None,groups=serving.aiinference.io,resources=aiinferences,verbs=create;update,versions=v1alpha1,name=validate-v1alpha1.aiinferences.serving.aiinference.io,admissionReviewVersions=v1,matchPolicy=Exact

// Register serves the defaulting, validating and conversion webhooks on
// server, and the pod webhook of multi-node groups, which asks mapper whether
// the cluster serves PodGroups.
func Register(server webhook.Server, scheme *runtime.Scheme, mapper meta.RESTMapper) {
	server.Register(DefaultPath, admission.WithDefaulter[*servingv1.AIInference](scheme, Defaulter{}))
	server.Register(ValidateV1Path, admission.WithValidator[*servingv1.AIInference](scheme, ValidatorV1{}))
	server.Register(ValidateV1Alpha1Path, admission.WithValidator[*servingv1alpha1.AIInference](scheme, ValidatorV1Alpha1{}))
	// v1alpha1 converts through the v1 hub (api/v1alpha1/aiinference_conversion.go).
	server.Register(ConvertPath, conversion.NewWebhookHandler(scheme, conversion.NewRegistry()))
	server.Register(GroupPodPath, &webhook.Admission{Handler: GroupPods{
		Decoder: admission.NewDecoder(scheme),
		ServesPodGroups: func() bool {
			_, err := mapper.RESTMapping(schedulingv1beta1.SchemeGroupVersion.WithKind("PodGroup").GroupKind(), schedulingv1beta1.SchemeGroupVersion.Version)
			return err == nil
		},
	}})
}

// Defaulter sets the defaults that depend on other fields, which the CRD's static
// defaults cannot: the engine's usual port.
type Defaulter struct{}

// Default sets engine.port to the engine's default port when unset.
func (Defaulter) Default(_ context.Context, obj *servingv1.AIInference) error {
	if msg := obj.DecodeError(); msg != "" {
		// Its spec was not read: a patch made from it would drop the spec.
		return errors.New(msg)
	}
	if obj.Spec.Engine.Port == 0 {
		if eng, err := engine.For(obj.Spec.Engine.Type); err == nil {
			obj.Spec.Engine.Port = eng.DefaultPort()
		}
	}
	return nil
}

// ValidatorV1 validates v1 objects.
type ValidatorV1 struct{}

func (ValidatorV1) ValidateCreate(_ context.Context, obj *servingv1.AIInference) (admission.Warnings, error) {
	return result(obj.Name, v1Paths)(validate(obj, v1Paths))
}

// ValidateUpdate refuses only problems the update brings in, so that an object
// admitted before a rule existed can still be edited (or its finalizers removed)
// without first fixing what it already had.
func (ValidatorV1) ValidateUpdate(_ context.Context, oldObj, obj *servingv1.AIInference) (admission.Warnings, error) {
	_, oldErrs := validate(oldObj, v1Paths)
	warnings, errs := validate(obj, v1Paths)
	return result(obj.Name, v1Paths)(warnings, newProblems(oldErrs, errs))
}

func (ValidatorV1) ValidateDelete(context.Context, *servingv1.AIInference) (admission.Warnings, error) {
	return nil, nil
}

// ValidatorV1Alpha1 validates v1alpha1 objects through their v1 form.
type ValidatorV1Alpha1 struct{}

func (ValidatorV1Alpha1) ValidateCreate(_ context.Context, obj *servingv1alpha1.AIInference) (admission.Warnings, error) {
	return validateV1Alpha1(nil, obj)
}

// ValidateUpdate refuses only problems the update brings in, as for v1.
func (ValidatorV1Alpha1) ValidateUpdate(_ context.Context, oldObj, obj *servingv1alpha1.AIInference) (admission.Warnings, error) {
	return validateV1Alpha1(oldObj, obj)
}

func (ValidatorV1Alpha1) ValidateDelete(context.Context, *servingv1alpha1.AIInference) (admission.Warnings, error) {
	return nil, nil
}

func validateV1Alpha1(oldObj, obj *servingv1alpha1.AIInference) (admission.Warnings, error) {
	hub := &servingv1.AIInference{}
	if err := obj.DeepCopy().ConvertTo(hub); err != nil {
		return result(obj.Name, v1alpha1Paths)(nil, field.ErrorList{
			field.Invalid(field.NewPath("metadata", "annotations").Key(servingv1alpha1.AnnotationV1Fields), "", err.Error()+"; remove the annotation"),
		})
	}
	warnings, errs := validate(hub, v1alpha1Paths)
	if oldObj != nil {
		oldHub := &servingv1.AIInference{}
		if err := oldObj.DeepCopy().ConvertTo(oldHub); err == nil {
			_, oldErrs := validate(oldHub, v1alpha1Paths)
			errs = newProblems(oldErrs, errs)
		}
	}
	return result(obj.Name, v1alpha1Paths)(warnings, errs)
}

// newProblems are the problems of errs that oldErrs does not have.
func newProblems(oldErrs, errs field.ErrorList) field.ErrorList {
	had := make(map[string]bool, len(oldErrs))
	for _, e := range oldErrs {
		had[e.Error()] = true
	}
	var added field.ErrorList
	for _, e := range errs {
		if !had[e.Error()] {
			added = append(added, e)
		}
	}
	return added
}

// result turns the findings into the admission answer: an Invalid API error that
// lists every problem, and the warnings.
func result(name string, p paths) func([]string, field.ErrorList) (admission.Warnings, error) {
	return func(warnings []string, errs field.ErrorList) (admission.Warnings, error) {
		if len(errs) == 0 {
			return warnings, nil
		}
		gk := servingv1.GroupVersion.WithKind("AIInference").GroupKind()
		err := apierrors.NewInvalid(gk, name, errs)
		err.ErrStatus.Message = fmt.Sprintf("AIInference %q (%s) is invalid: %s", name, p.version, errs.ToAggregate().Error())
		return warnings, err
	}
}
