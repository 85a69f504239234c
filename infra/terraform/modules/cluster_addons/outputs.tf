output "external_secrets_namespace" {
  description = "Namespace of the External Secrets controller."
  value       = helm_release.external_secrets.namespace
}

output "keda_namespace" {
  description = "Namespace of the KEDA operator."
  value       = helm_release.keda.namespace
}
