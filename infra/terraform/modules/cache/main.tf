# Cache: ElastiCache Redis for the Celery broker, rate limits, the replica registry and the
# resolution cache. TLS in transit, an AUTH token kept in Secrets Manager, KMS at rest, no
# eviction (a broker must never drop a queued job), reachable only from the cluster's nodes.

module "kms" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/kms/aws"
  version = "3.1.1"

  description             = "${var.name}: cache at rest and its AUTH token"
  deletion_window_in_days = 30
  enable_key_rotation     = true
  aliases                 = ["${var.name}-cache"]

  tags = var.tags
}

resource "random_password" "auth_token" {
  length  = 64
  special = false
}

resource "aws_secretsmanager_secret" "auth_token" {
  name_prefix = "${var.name}-redis-auth-"
  description = "AUTH token of the ${var.name} Redis (JSON: password)"
  kms_key_id  = module.kms.key_arn
  tags        = var.tags

  #checkov:skip=CKV2_AWS_57:ElastiCache cannot rotate an AUTH token without a client restart; rotate by the runbook in infra/README.md.
}

resource "aws_secretsmanager_secret_version" "auth_token" {
  secret_id     = aws_secretsmanager_secret.auth_token.id
  secret_string = jsonencode({ password = random_password.auth_token.result })
}

module "redis" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/elasticache/aws"
  version = "1.6.0"

  replication_group_id = var.name
  description          = "loraplex broker, rate limits and replica registry"

  engine         = "redis"
  engine_version = var.engine_version
  node_type      = var.node_type
  port           = 6379

  num_cache_clusters         = 1 + var.replicas
  automatic_failover_enabled = var.replicas > 0
  multi_az_enabled           = var.replicas > 0

  transit_encryption_enabled = true
  auth_token                 = random_password.auth_token.result
  at_rest_encryption_enabled = true
  kms_key_arn                = module.kms.key_arn

  vpc_id = var.vpc_id
  security_group_rules = {
    ingress_nodes = {
      description                  = "Redis from the EKS nodes (pods are further limited by NetworkPolicies)"
      referenced_security_group_id = var.client_security_group_id
    }
  }

  create_subnet_group = false
  subnet_group_name   = var.subnet_group_name

  create_parameter_group = true
  parameter_group_family = "redis7"
  parameters = [
    { name = "maxmemory-policy", value = "noeviction" },
  ]

  snapshot_retention_limit = 7
  maintenance_window       = "sun:05:00-sun:06:00"
  apply_immediately        = false

  tags = var.tags
}
