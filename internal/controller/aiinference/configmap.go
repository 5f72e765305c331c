package aiinference

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"strings"

	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	servingv1 "github.com/aiinference/operator/api/v1"
	"github.com/aiinference/operator/internal/loadspec"
)

// loaderConfig is the configuration the loader reads from the ConfigMap.
func loaderConfig(obj *servingv1.AIInference) loadspec.Config {
	cfg := loadspec.Config{
		Dest:           modelPath(obj),
		Timeout:        loadspec.Duration{Duration: obj.LoadTimeout()},
		SHA256Manifest: obj.Spec.Model.SHA256Manifest,
		Fsync:          cacheOutlivesPod(obj),
		Adapters:       startAdapters(obj),
	}
	setSource(&cfg, obj.Spec.Model.Source)
	return cfg
}

// setSource is where the loader fetches from, for the model and for each
// adapter (which take the same sources).
func setSource(cfg *loadspec.Config, src servingv1.ModelSource) {
	switch {
	case src.S3 != nil:
		cfg.Source = "s3://" + src.S3.Bucket + "/" + strings.TrimPrefix(src.S3.Prefix, "/")
		cfg.S3 = &loadspec.S3Options{Endpoint: src.S3.Endpoint, Region: src.S3.Region, PathStyle: src.S3.PathStyle}
	case src.PVC != nil:
		cfg.Source = "file://" + path.Join(sourceMountPath, src.PVC.Path)
	case src.HTTP != nil:
		cfg.Source = src.HTTP.URL
	case src.HuggingFace != nil:
		cfg.Source = hfSourceURL(src.HuggingFace)
		cfg.HuggingFace = hfOptions(src.HuggingFace)
	case src.OCI != nil:
		cfg.Source = "oci://" + src.OCI.Reference
		cfg.OCI = &loadspec.OCIOptions{PlainHTTP: src.OCI.PlainHTTP}
	}
}

// cacheOutlivesPod is true for a cache that outlives the pod (a PVC, the
// node's): its complete marker must never stand over data a node crash lost,
// so the loader flushes. An emptyDir dies with the pod and needs no flush.
func cacheOutlivesPod(obj *servingv1.AIInference) bool {
	t := resolvedCache(obj).Type
	return t == servingv1.CachePVC || t == servingv1.CacheNode
}

// desiredConfig is the loader configuration file, as JSON.
func desiredConfig(obj *servingv1.AIInference) (string, error) {
	config, err := json.MarshalIndent(loaderConfig(obj), "", "  ")
	if err != nil {
		return "", fmt.Errorf("encoding loader config: %w", err)
	}
	return string(config), nil
}

// desiredConfigMap holds the loader configuration and the retry budget. Only the
// configuration is part of the pod template: the budget changes as loads fail and
// reaches running loaders without rolling the pods.
func desiredConfigMap(obj *servingv1.AIInference, config string, budget loadspec.Budget) (*corev1.ConfigMap, error) {
	budgetJSON, err := json.MarshalIndent(budget, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding loader budget: %w", err)
	}
	data := map[string]string{
		loadspec.ConfigFileName: config,
		loadspec.BudgetFileName: string(budgetJSON),
	}
	resolved, err := resolvedFile(obj)
	if err != nil {
		return nil, err
	}
	if resolved != "" {
		data[loadspec.ResolvedFileName] = resolved
	}
	adapters, err := adapterSetData(obj)
	if err != nil {
		return nil, err
	}
	maps.Copy(data, adapters)
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: childMeta(obj, obj.LoaderConfigMapName()),
		Data:       data,
	}, nil
}

// desiredCanaryConfigMap is the canary's loader configuration: the stable pods
// keep theirs (a restarted stable pod loads the stable model).
func desiredCanaryConfigMap(obj *servingv1.AIInference, config string, budget loadspec.Budget) (*corev1.ConfigMap, error) {
	cm, err := desiredConfigMap(obj, config, budget)
	if err != nil {
		return nil, err
	}
	cm.Name = obj.CanaryLoaderConfigMapName()
	return cm, nil
}

// reconcileConfigMap writes the loader configuration. In a canary rollout the
// canary has its own, and the stable pods keep theirs until promotion: a
// restarted stable pod must load the stable model.
func (r *Reconciler) reconcileConfigMap(ctx context.Context, s *scope) error {
	budget := loaderBudget(s.obj, s.loads)
	canary, err := desiredCanaryConfigMap(s.obj, s.config, budget)
	if err != nil {
		return err
	}
	if s.obs.rollout.canaryActive() {
		if _, err := r.apply(ctx, s, canary, &corev1.ConfigMap{}); err != nil {
			return err
		}
	} else if err := r.deleteOwned(ctx, s, canary, &corev1.ConfigMap{}); err != nil {
		return err
	}
	if isCanary(s.obj) && (s.obs.rollout == nil || s.obs.rollout.keepStableTemplate) {
		trace.SpanFromContext(ctx).SetAttributes(attrDecision.String("skipped"), attrWhy.String("the stable pods keep their configuration during a canary rollout"))
		return nil
	}
	cm, err := desiredConfigMap(s.obj, s.config, budget)
	if err != nil {
		return err
	}
	_, err = r.apply(ctx, s, cm, &corev1.ConfigMap{})
	return err
}
