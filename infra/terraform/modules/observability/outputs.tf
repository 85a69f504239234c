output "monitoring_namespace" {
  description = "Namespace of Prometheus and Grafana (its Prometheus may scrape the engine replicas)."
  value       = kubernetes_namespace_v1.monitoring.metadata[0].name
}

output "prometheus_url" {
  description = "In-cluster URL of Prometheus (KEDA's queue-depth trigger queries it)."
  value       = "http://kube-prometheus-stack-prometheus.${kubernetes_namespace_v1.monitoring.metadata[0].name}.svc:9090"
}

output "container_log_group" {
  description = "CloudWatch log group of the containers' logs."
  value       = aws_cloudwatch_log_group.containers.name
}
