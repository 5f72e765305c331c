// Package webhook serves the AIInference admission webhooks (defaulting and the
// validation CEL in the CRD cannot express) and the conversion webhook between the
// served versions, and keeps the webhook serving certificate valid.
package webhook
